// psa-check evaluates the pod templates of Kubernetes manifests against the
// Pod Security Standards with the Pod Security admission controller's own
// code (k8s.io/pod-security-admission/policy), so a manifest's claim to pass
// "restricted" or "baseline" is checked offline, without a cluster.
//
// Usage: psa-check FILE... (multi-document YAML). It prints one JSON object:
//
//	{"files": [{"file": F, "objects": [{"kind": K, "name": N, "levels": {
//	  "restricted": {"allowed": B, "failed": [CHECK...]},
//	  "baseline": {...}}}]}]}
//
// with CHECK = {"id", "reason", "detail", "pod", "containers"}: the check's ID
// in the policy package ("hostPathVolumes", "privileged", ...), its reason and
// detail as the admission controller words them, whether the pod's own fields
// fail it (with no container at all), and the containers that fail it alone.
//
// Every object holding a pod is evaluated: Pod, Deployment, DaemonSet,
// StatefulSet, ReplicaSet, ReplicationController, Job, CronJob, PodTemplate;
// other kinds are skipped. Levels are evaluated at the latest policy version.
// Exit status: 0 when every file was read (whatever the verdicts), 2 on an
// unreadable file or an object that does not decode (unknown fields too).
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"

	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"k8s.io/pod-security-admission/api"
	"k8s.io/pod-security-admission/policy"
	kjson "sigs.k8s.io/json"
	"sigs.k8s.io/yaml"
)

// Failure is one failed check of one pod template at one level.
type Failure struct {
	ID         string   `json:"id"`
	Reason     string   `json:"reason"`
	Detail     string   `json:"detail"`
	Pod        bool     `json:"pod"`
	Containers []string `json:"containers"`
}

// Verdict is one pod template's result at one level.
type Verdict struct {
	Allowed bool      `json:"allowed"`
	Failed  []Failure `json:"failed"`
}

// Object is one manifest object that holds a pod template.
type Object struct {
	Kind   string             `json:"kind"`
	Name   string             `json:"name"`
	Levels map[string]Verdict `json:"levels"`
}

// File is one input file's objects, in document order.
type File struct {
	File    string   `json:"file"`
	Objects []Object `json:"objects"`
}

var levels = []api.Level{api.LevelRestricted, api.LevelBaseline}

// checker holds the full evaluator (the verdict) and one evaluator per check
// (which check failed: the policy package's results carry no check ID).
type checker struct {
	all        policy.Evaluator
	single     map[policy.CheckID]policy.Evaluator
	checks     []policy.Check
	overridden map[policy.CheckID]bool // baseline checks a restricted one replaces at the latest version
}

func newChecker() (*checker, error) {
	checks := policy.DefaultChecks()
	all, err := policy.NewEvaluator(checks, nil)
	if err != nil {
		return nil, err
	}
	c := &checker{all: all, single: map[policy.CheckID]policy.Evaluator{}, checks: checks,
		overridden: map[policy.CheckID]bool{}}
	for _, check := range checks {
		e, err := policy.NewEvaluator([]policy.Check{check}, nil)
		if err != nil {
			return nil, fmt.Errorf("check %s: %w", check.ID, err)
		}
		c.single[check.ID] = e
		if check.Level == api.LevelRestricted {
			for _, id := range check.Versions[len(check.Versions)-1].OverrideCheckIDs {
				c.overridden[id] = true
			}
		}
	}
	return c, nil
}

// failed runs one check on a pod at a level; nil when it passes or does not apply.
func (c *checker) failed(check policy.Check, level api.Level, meta *metav1.ObjectMeta, spec *corev1.PodSpec) *policy.CheckResult {
	lv := api.LevelVersion{Level: level, Version: api.LatestVersion()}
	for _, r := range c.single[check.ID].EvaluatePod(lv, meta, spec) {
		if !r.Allowed {
			return &r
		}
	}
	return nil
}

func (c *checker) evaluate(meta *metav1.ObjectMeta, spec *corev1.PodSpec) (map[string]Verdict, error) {
	out := map[string]Verdict{}
	for _, level := range levels {
		lv := api.LevelVersion{Level: level, Version: api.LatestVersion()}
		agg := policy.AggregateCheckResults(c.all.EvaluatePod(lv, meta, spec))
		v := Verdict{Allowed: agg.Allowed, Failed: []Failure{}}
		for _, check := range c.checks {
			if check.Level == api.LevelRestricted && level == api.LevelBaseline {
				continue
			}
			if level == api.LevelRestricted && check.Level == api.LevelBaseline && c.overridden[check.ID] {
				continue
			}
			r := c.failed(check, level, meta, spec)
			if r == nil {
				continue
			}
			v.Failed = append(v.Failed, c.attribute(check, level, meta, spec, r))
		}
		// The per-check runs must add up to the admission controller's own verdict.
		var reasons []string
		for _, f := range v.Failed {
			reasons = append(reasons, f.Reason)
		}
		if agg.Allowed != (len(v.Failed) == 0) || !slices.Equal(slices.Sorted(slices.Values(reasons)),
			slices.Sorted(slices.Values(agg.ForbiddenReasons))) {
			return nil, fmt.Errorf("level %s: per-check results %q disagree with the evaluator's %q",
				level, reasons, agg.ForbiddenReasons)
		}
		out[string(level)] = v
	}
	return out, nil
}

// attribute says who fails a check: the pod's own fields (it fails with no
// container), and each container that fails it alone.
func (c *checker) attribute(check policy.Check, level api.Level, meta *metav1.ObjectMeta, spec *corev1.PodSpec,
	r *policy.CheckResult) Failure {
	f := Failure{ID: string(check.ID), Reason: r.ForbiddenReason, Detail: r.ForbiddenDetail, Containers: []string{}}
	bare := spec.DeepCopy()
	bare.Containers, bare.InitContainers, bare.EphemeralContainers = nil, nil, nil
	f.Pod = c.failed(check, level, meta, bare) != nil
	one := func(init bool, ctr corev1.Container) {
		s := bare.DeepCopy()
		if init {
			s.InitContainers = []corev1.Container{ctr}
		} else {
			s.Containers = []corev1.Container{ctr}
		}
		if c.failed(check, level, meta, s) != nil {
			f.Containers = append(f.Containers, ctr.Name)
		}
	}
	if !f.Pod {
		for _, ctr := range spec.InitContainers {
			one(true, ctr)
		}
		for _, ctr := range spec.Containers {
			one(false, ctr)
		}
	}
	return f
}

// decode reads one YAML document into an API object as the API server does:
// field names are case-sensitive, and an unknown or duplicate field is an
// error (a misspelt field must not pass as an absent one).
func decode(doc []byte, obj any) error {
	data, err := yaml.YAMLToJSON(doc)
	if err != nil {
		return err
	}
	strict, err := kjson.UnmarshalStrict(data, obj)
	if err != nil {
		return err
	}
	return errors.Join(strict...)
}

// template returns the pod template of a manifest object, or ok=false for a
// kind that holds none.
func template(kind string, doc []byte) (meta metav1.ObjectMeta, spec *corev1.PodSpec, ok bool, err error) {
	if kind == "Pod" {
		var o corev1.Pod
		err = decode(doc, &o)
		return o.ObjectMeta, &o.Spec, err == nil, err
	}
	var obj any
	var pick func() *corev1.PodTemplateSpec
	switch kind {
	case "PodTemplate":
		o := &corev1.PodTemplate{}
		obj, pick = o, func() *corev1.PodTemplateSpec { return &o.Template }
	case "ReplicationController":
		o := &corev1.ReplicationController{}
		obj, pick = o, func() *corev1.PodTemplateSpec { return o.Spec.Template }
	case "Deployment":
		o := &appsv1.Deployment{}
		obj, pick = o, func() *corev1.PodTemplateSpec { return &o.Spec.Template }
	case "DaemonSet":
		o := &appsv1.DaemonSet{}
		obj, pick = o, func() *corev1.PodTemplateSpec { return &o.Spec.Template }
	case "StatefulSet":
		o := &appsv1.StatefulSet{}
		obj, pick = o, func() *corev1.PodTemplateSpec { return &o.Spec.Template }
	case "ReplicaSet":
		o := &appsv1.ReplicaSet{}
		obj, pick = o, func() *corev1.PodTemplateSpec { return &o.Spec.Template }
	case "Job":
		o := &batchv1.Job{}
		obj, pick = o, func() *corev1.PodTemplateSpec { return &o.Spec.Template }
	case "CronJob":
		o := &batchv1.CronJob{}
		obj, pick = o, func() *corev1.PodTemplateSpec { return &o.Spec.JobTemplate.Spec.Template }
	default:
		return meta, nil, false, nil
	}
	if err := decode(doc, obj); err != nil {
		return meta, nil, false, err
	}
	t := pick()
	if t == nil {
		return meta, nil, false, nil
	}
	return t.ObjectMeta, &t.Spec, true, nil
}

func checkFile(c *checker, path string) (File, error) {
	out := File{File: path, Objects: []Object{}}
	data, err := os.ReadFile(path)
	if err != nil {
		return out, err
	}
	reader := utilyaml.NewYAMLReader(bufio.NewReader(bytes.NewReader(data)))
	for i := 0; ; i++ {
		doc, err := reader.Read()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return out, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		var head struct {
			Kind     string `json:"kind"`
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		if err := yaml.Unmarshal(doc, &head); err != nil {
			return out, fmt.Errorf("%s: document %d: %w", path, i, err)
		}
		if head.Kind == "" {
			continue // an empty document (comments only)
		}
		meta, spec, ok, err := template(head.Kind, doc)
		if err != nil {
			return out, fmt.Errorf("%s: %s %q: %w", path, head.Kind, head.Metadata.Name, err)
		}
		if !ok {
			continue
		}
		verdicts, err := c.evaluate(&meta, spec)
		if err != nil {
			return out, fmt.Errorf("%s: %s %q: %w", path, head.Kind, head.Metadata.Name, err)
		}
		out.Objects = append(out.Objects, Object{Kind: head.Kind, Name: head.Metadata.Name, Levels: verdicts})
	}
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: psa-check FILE... (Kubernetes manifests; prints the Pod Security verdicts as JSON)")
		os.Exit(2)
	}
	c, err := newChecker()
	if err != nil {
		fmt.Fprintln(os.Stderr, "psa-check:", err)
		os.Exit(2)
	}
	result := struct {
		Files []File `json:"files"`
	}{Files: []File{}}
	status := 0
	for _, path := range os.Args[1:] {
		f, err := checkFile(c, path)
		if err != nil {
			fmt.Fprintln(os.Stderr, "psa-check:", err)
			status = 2
		}
		result.Files = append(result.Files, f)
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(result); err != nil {
		fmt.Fprintln(os.Stderr, "psa-check:", err)
		os.Exit(2)
	}
	os.Exit(status)
}
