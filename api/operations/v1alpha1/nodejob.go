package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// NodeJob is what NodeUpgradeJob and ImagePrePullJob have in common, so
// that one controller and one executor serve both.
// +kubebuilder:object:generate=false
type NodeJob interface {
	client.Object
	// JobKind is the kind's name, also before TypeMeta is filled in.
	JobKind() string
	// Target returns the node names or the label selector.
	Target() ([]string, *metav1.LabelSelector)
	// Execution returns the shared knobs.
	Execution() JobExecution
	// Aborted reports whether `drover abort` stopped the job.
	Aborted() bool
	// ImageCount is the number of images each node reports on (0 for upgrades).
	ImageCount() int
	// JobStatus is the status, to read and change in place.
	JobStatus() *NodeJobStatus
}

// JobKind implements NodeJob.
func (j *NodeUpgradeJob) JobKind() string { return "NodeUpgradeJob" }

// Target implements NodeJob.
func (j *NodeUpgradeJob) Target() ([]string, *metav1.LabelSelector) {
	return j.Spec.NodeNames, j.Spec.LabelSelector
}

// Execution implements NodeJob.
func (j *NodeUpgradeJob) Execution() JobExecution { return j.Spec.JobExecution }

// Aborted implements NodeJob.
func (j *NodeUpgradeJob) Aborted() bool { return j.Spec.Abort }

// ImageCount implements NodeJob.
func (j *NodeUpgradeJob) ImageCount() int { return 0 }

// JobStatus implements NodeJob.
func (j *NodeUpgradeJob) JobStatus() *NodeJobStatus { return &j.Status }

// JobKind implements NodeJob.
func (j *ImagePrePullJob) JobKind() string { return "ImagePrePullJob" }

// Target implements NodeJob.
func (j *ImagePrePullJob) Target() ([]string, *metav1.LabelSelector) {
	return j.Spec.NodeNames, j.Spec.LabelSelector
}

// Execution implements NodeJob.
func (j *ImagePrePullJob) Execution() JobExecution { return j.Spec.JobExecution }

// Aborted implements NodeJob.
func (j *ImagePrePullJob) Aborted() bool { return j.Spec.Abort }

// ImageCount implements NodeJob.
func (j *ImagePrePullJob) ImageCount() int { return len(j.Spec.Images) }

// JobStatus implements NodeJob.
func (j *ImagePrePullJob) JobStatus() *NodeJobStatus { return &j.Status }

var (
	_ NodeJob = &NodeUpgradeJob{}
	_ NodeJob = &ImagePrePullJob{}
)
