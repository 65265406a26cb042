package cli

import (
	"encoding/json"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	serverlessv1 "github.com/drover-fleet/drover/api/serverless/v1alpha1"
	"github.com/drover-fleet/drover/internal/serverless/apptoken"
)

func newAppCommand(g *globalOptions) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "app token create|list|revoke",
		Short: "Manage the tokens an application's customers use with the session API",
	}
	token := &cobra.Command{Use: "token", Short: "Create, list or revoke application tokens (stored hashed on the Application)"}
	var namespace string
	var ttl time.Duration
	create := &cobra.Command{
		Use:   "create APP",
		Short: "Mint a token for APP's session API and print it (it is shown once; only its hash is stored)",
		Example: `  drover app token create echo --ttl 24h
  curl -H "Authorization: Bearer $TOKEN" -X POST https://MANAGER:8446/v1/sessions -d '{}'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ns, a, err := tokenApp(cmd, g, namespace, args[0])
			if err != nil {
				return err
			}
			t, err := apptoken.New(ns, a.Name, ttl, time.Now())
			if err != nil {
				return err
			}
			if err := patchAnnotation(cmd, c, a, apptoken.AnnotationKey(t.ID), ptr.To(t.AnnotationValue())); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "token %s of %s/%s expires %s; revoke it with `drover app token revoke %s %s -n %s`\n",
				t.ID, ns, a.Name, t.Expires.Format(time.RFC3339), a.Name, t.ID, ns)
			fmt.Fprintln(cmd.OutOrStdout(), t.Value)
			return nil
		},
	}
	create.Flags().DurationVar(&ttl, "ttl", 24*time.Hour, "how long the token is valid (at most a year)")
	list := &cobra.Command{
		Use:   "list APP",
		Short: "List APP's tokens (ids and expiry; the tokens themselves are not stored)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			_, ns, a, err := tokenApp(cmd, g, namespace, args[0])
			if err != nil {
				return err
			}
			ts := apptoken.List(a.Annotations)
			if len(ts) == 0 {
				fmt.Fprintf(cmd.ErrOrStderr(), "No tokens for %s/%s.\n", ns, a.Name)
				return nil
			}
			now := time.Now()
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 3, ' ', 0)
			fmt.Fprintln(tw, "ID\tEXPIRES\tSTATUS")
			for _, t := range ts {
				status := "valid for " + duration.HumanDuration(t.Expires.Sub(now))
				if !now.Before(t.Expires) {
					status = "expired"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\n", t.ID, t.Expires.Format(time.RFC3339), status)
			}
			return tw.Flush()
		},
	}
	revoke := &cobra.Command{
		Use:   "revoke APP ID",
		Short: "Revoke a token of APP at once",
		Args:  cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, ns, a, err := tokenApp(cmd, g, namespace, args[0])
			if err != nil {
				return err
			}
			if _, ok := a.Annotations[apptoken.AnnotationKey(args[1])]; !ok {
				return fmt.Errorf("application %s/%s has no token %s (see `drover app token list %s`)", ns, a.Name, args[1], a.Name)
			}
			if err := patchAnnotation(cmd, c, a, apptoken.AnnotationKey(args[1]), nil); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "token %s of %s/%s revoked\n", args[1], ns, a.Name)
			return nil
		},
	}
	token.PersistentFlags().StringVarP(&namespace, "namespace", "n", "", "namespace of the application"+namespaceFlagHelp)
	token.AddCommand(create, list, revoke)
	cmd.AddCommand(token)
	return cmd
}

// tokenApp reads the Application whose tokens a command manages.
func tokenApp(cmd *cobra.Command, g *globalOptions, namespace, name string) (client.Client, string, *serverlessv1.Application, error) {
	c, err := g.client()
	if err != nil {
		return nil, "", nil, err
	}
	ns := g.namespace(namespace)
	var a serverlessv1.Application
	if err := c.Get(cmd.Context(), client.ObjectKey{Namespace: ns, Name: name}, &a); err != nil {
		return nil, "", nil, notFound("application", name, ns, err)
	}
	return c, ns, &a, nil
}

// patchAnnotation sets (or with nil, removes) one annotation of a with a
// merge patch, so that concurrent edits of other annotations are kept.
func patchAnnotation(cmd *cobra.Command, c client.Client, a *serverlessv1.Application, key string, value *string) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]*string{key: value}}})
	if err != nil {
		return err
	}
	if err := c.Patch(cmd.Context(), a, client.RawPatch(types.MergePatchType, body)); err != nil {
		return fmt.Errorf("update the tokens of application %s/%s: %w", a.Namespace, a.Name, err)
	}
	return nil
}
