// Package gen parses the CtrlKit DSL and generates Go code from it: typed
// state loaders on controller-runtime's client, the interface a controller
// implements (one method per action), a manager that turns those methods
// into ctrlkit.Actions, and a reconciler skeleton that runs a workflow of
// them. docs/ctrlkit.md is the DSL reference.
//
// Parse reports every problem it finds as "file:line:col: message"
// (ErrorList); Generate is only reached with a file that parsed and
// checked cleanly, so a bad document generates nothing.
//
// The generator does not type-check field references such as
// ${target.Spec.Name}: the Go compiler does, when the generated file is
// built. The golden tests build every generated case for that reason.
package gen
