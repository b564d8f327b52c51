// Package helm_test checks the Helm chart in connector-svc/ offline, with the
// pinned helm from .tools/bin (scripts/tools.sh helm): helm lint --strict,
// helm template with the default values and with ci/all-on-values.yaml, every
// rendered document decoded strictly into its k8s.io/api type, and what the
// chart promises about probes, shutdown, security, secrets and settings. No
// cluster runs here: no kubelet, scheduler, kube-proxy or admission; what
// those would do with the objects is not tested.
package helm_test

import (
	"bytes"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/connector-svc/connector-svc/internal/loudskip"
	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	policyv1 "k8s.io/api/policy/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

const (
	chartDir       = "connector-svc"
	allOnValues    = "ci/all-on-values.yaml"
	requiredValues = "ci/required-values.yaml" // image.repository, which has no default
	// kubeVersion is the cluster version every rendering assumes unless it
	// names one: the pinned helm, built with go install, would assume 1.20.
	kubeVersion   = "1.33.0"
	release       = "demo"
	namespace     = "apps"
	stdioKillWait = 2 * time.Second // internal/registry CloseGrace: after SHUTDOWN_GRACE, before a stdio server is killed
)

// secretSettings come only from Secrets, never from values or a ConfigMap.
var secretSettings = []string{"SECRET_KEY", "DATABASE_URL", "LLM_API_KEY"}

// downwardAPIOnly are variables the chart defines only so that others can
// name them as $(NAME); the binary does not read them.
var downwardAPIOnly = map[string]string{"POD_NAME": "metadata.name", "POD_IP": "status.podIP"}

// repoRoot is the module root: this package sits two levels below it.
func repoRoot(t *testing.T) string {
	t.Helper()
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	return root
}

// helmBin is the pinned helm, or a loud skip (a failure under CI=true).
func helmBin(t *testing.T) string {
	t.Helper()
	root := repoRoot(t)
	bin := filepath.Join(root, ".tools", "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		loudskip.Skip(t, "helm is missing from .tools/bin: run scripts/tools.sh helm")
	}
	script, err := os.ReadFile(filepath.Join(root, "scripts", "tools.sh"))
	if err != nil {
		t.Fatal(err)
	}
	pin := regexp.MustCompile(`\[helm\]=(\S+)`).FindSubmatch(script)
	if pin == nil {
		t.Fatal("scripts/tools.sh pins no helm")
	}
	stamp, _ := os.ReadFile(filepath.Join(root, ".tools", "bin", ".helm.version"))
	if got := strings.TrimSpace(string(stamp)); got != string(pin[1]) {
		loudskip.Skip(t, fmt.Sprintf(".tools/bin/helm is %q, scripts/tools.sh pins %s: run scripts/tools.sh helm", got, pin[1]))
	}
	return bin
}

// helm runs the pinned helm in this directory and returns its stdout, its
// stderr and its error. helm template and helm lint get the required values
// (ci/required-values.yaml) and --kube-version first, so that the arguments
// after them win; helmBare adds nothing.
func helm(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	if len(args) > 0 && (args[0] == "template" || args[0] == "lint") {
		args = append([]string{args[0], "-f", requiredValues, "--kube-version", kubeVersion}, args[1:]...)
	}
	return helmBare(t, args...)
}

func helmBare(t *testing.T, args ...string) (string, string, error) {
	t.Helper()
	cmd := exec.Command(helmBin(t), args...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	err := cmd.Run()
	return stdout.String(), stderr.String(), err
}

// render is helm template of the chart with extra arguments (-f, --set).
func render(t *testing.T, extra ...string) string {
	t.Helper()
	out, stderr, err := helm(t, append([]string{"template", release, chartDir, "--namespace", namespace}, extra...)...)
	if err != nil {
		t.Fatalf("helm template %s: %v\n%s", strings.Join(extra, " "), err, stderr)
	}
	return out
}

func TestChartLintStrict(t *testing.T) {
	for name, extra := range map[string][]string{"defaults": nil, "all-on": {"-f", allOnValues}} {
		t.Run(name, func(t *testing.T) {
			out, stderr, err := helm(t, append([]string{"lint", "--strict", chartDir}, extra...)...)
			if err != nil {
				t.Fatalf("helm lint --strict: %v\n%s%s", err, out, stderr)
			}
			if !strings.Contains(out, "1 chart(s) linted, 0 chart(s) failed") {
				t.Fatalf("helm lint --strict did not pass the chart:\n%s%s", out, stderr)
			}
			if strings.Contains(out, "[WARNING]") || strings.Contains(out, "[ERROR]") {
				t.Fatalf("helm lint --strict warns:\n%s", out)
			}
		})
	}
}

// objects are one rendering, decoded strictly.
type objects struct {
	deployments     []appsv1.Deployment
	services        []corev1.Service
	configMaps      []corev1.ConfigMap
	serviceAccounts []corev1.ServiceAccount
	pdbs            []policyv1.PodDisruptionBudget
	netpols         []networkingv1.NetworkPolicy
	ingresses       []networkingv1.Ingress
	serviceMonitors []unstructured.Unstructured
}

var docSeparator = regexp.MustCompile(`(?m)^---\s*$`)

// decode splits helm's output into documents and decodes each strictly
// (unknown or duplicate fields fail) into the k8s.io/api type of its
// apiVersion and kind; the ServiceMonitor, a CRD's kind, as unstructured.
func decode(t *testing.T, rendered string) objects {
	t.Helper()
	var objs objects
	for _, doc := range docSeparator.Split(rendered, -1) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			t.Fatalf("not YAML: %v\n%s", err, doc)
		}
		if tm.Kind == "" && tm.APIVersion == "" {
			if strings.TrimSpace(stripComments(doc)) != "" {
				t.Fatalf("a document without apiVersion and kind:\n%s", doc)
			}
			continue
		}
		var err error
		switch tm.APIVersion + " " + tm.Kind {
		case "apps/v1 Deployment":
			objs.deployments = append(objs.deployments, appsv1.Deployment{})
			err = yaml.UnmarshalStrict([]byte(doc), &objs.deployments[len(objs.deployments)-1])
		case "v1 Service":
			objs.services = append(objs.services, corev1.Service{})
			err = yaml.UnmarshalStrict([]byte(doc), &objs.services[len(objs.services)-1])
		case "v1 ConfigMap":
			objs.configMaps = append(objs.configMaps, corev1.ConfigMap{})
			err = yaml.UnmarshalStrict([]byte(doc), &objs.configMaps[len(objs.configMaps)-1])
		case "v1 ServiceAccount":
			objs.serviceAccounts = append(objs.serviceAccounts, corev1.ServiceAccount{})
			err = yaml.UnmarshalStrict([]byte(doc), &objs.serviceAccounts[len(objs.serviceAccounts)-1])
		case "policy/v1 PodDisruptionBudget":
			objs.pdbs = append(objs.pdbs, policyv1.PodDisruptionBudget{})
			err = yaml.UnmarshalStrict([]byte(doc), &objs.pdbs[len(objs.pdbs)-1])
		case "networking.k8s.io/v1 NetworkPolicy":
			objs.netpols = append(objs.netpols, networkingv1.NetworkPolicy{})
			err = yaml.UnmarshalStrict([]byte(doc), &objs.netpols[len(objs.netpols)-1])
		case "networking.k8s.io/v1 Ingress":
			objs.ingresses = append(objs.ingresses, networkingv1.Ingress{})
			err = yaml.UnmarshalStrict([]byte(doc), &objs.ingresses[len(objs.ingresses)-1])
		case "monitoring.coreos.com/v1 ServiceMonitor":
			var m map[string]any
			err = yaml.UnmarshalStrict([]byte(doc), &m)
			objs.serviceMonitors = append(objs.serviceMonitors, unstructured.Unstructured{Object: m})
		default:
			t.Fatalf("the chart renders %s %s, which this test does not decode: add its type", tm.APIVersion, tm.Kind)
		}
		if err != nil {
			t.Fatalf("%s does not decode strictly: %v\n%s", tm.Kind, err, doc)
		}
	}
	return objs
}

func stripComments(doc string) string {
	var b strings.Builder
	for _, line := range strings.Split(doc, "\n") {
		if !strings.HasPrefix(strings.TrimSpace(line), "#") {
			b.WriteString(line + "\n")
		}
	}
	return b.String()
}

// oauthWant is what a rendering promises about OAuth; the zero value is
// OAuth off: no OAUTH_* setting, callback port, Service, rule or Ingress.
type oauthWant struct {
	redirectURL string // OAUTH_REDIRECT_URL
	metadataURL string // OAUTH_CLIENT_METADATA_URL
	port        int32  // the callback listener's port; 0: none (the backend calls CompleteAuthorization)
	tlsSecret   string // the Secret of the listener's certificate; "": it serves HTTP
	ingress     bool   // an Ingress routes the public paths to the callback Service
	from        int    // NetworkPolicy peers allowed to reach the callback port; 0: anywhere
}

// mcpWant is what a rendering promises about the MCP endpoint; the zero
// value is the endpoint off: no MCP_* setting, mcp port, Service or rule.
type mcpWant struct {
	port        int32  // MCP_ADDR's port, the container's port mcp and the Service's; 0: off
	origins     string // MCP_ALLOWED_ORIGINS; "": none set
	maxBody     string // MCP_MAX_BODY_BYTES
	rateLimit   string // MCP_RATE_LIMIT
	rateBurst   string // MCP_RATE_BURST
	tlsSecret   string // the Secret of the gRPC certificate the endpoint serves (TLS_CERT_FILE); "": plain HTTP
	serviceType corev1.ServiceType
	from        int // NetworkPolicy peers allowed to reach the MCP port; 0: anywhere
}

// renderings are the values the tests render with, and what each promises.
var renderings = []struct {
	name            string
	args            []string
	replicas        int32
	serviceMonitors int
	dashboards      int
	oauth           oauthWant
	mcp             mcpWant
	preStopExec     bool                             // the preStop hook runs `sleep` in the container, not the native sleep action
	adminFrom       []networkingv1.NetworkPolicyPeer // who may reach the admin port; nil: the default, the release's namespace
	image           string                           // the container's image; "": ci/required-values.yaml's at the appVersion
}{
	{name: "defaults", replicas: 3},
	{name: "all-on", args: []string{"-f", allOnValues}, replicas: 4, serviceMonitors: 1, dashboards: 1, oauth: oauthWant{
		redirectURL: "https://connectors.example.com/oauth/callback", metadataURL: "https://connectors.example.com/oauth/client.json",
		port: 8081, tlsSecret: "connector-oauth-tls", ingress: true, from: 1},
		mcp: mcpWant{port: 9443, origins: "https://chat.example.com,http://localhost:3000", maxBody: "1048576", rateLimit: "2.5",
			rateBurst: "20", tlsSecret: "connector-tls", serviceType: corev1.ServiceTypeLoadBalancer, from: 1},
		image: "registry.example.com/team/connector-svc@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		adminFrom: []networkingv1.NetworkPolicyPeer{
			{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}},
				PodSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"app.kubernetes.io/name": "prometheus"}}},
			{PodSelector: &metav1.LabelSelector{}}}},
	{name: "preStop-exec", args: []string{"--set", "preStop.exec=true"}, replicas: 3, preStopExec: true},
	{name: "kubernetes-1.29", args: []string{"--kube-version", "1.29.4"}, replicas: 3, preStopExec: true},
	{name: "kubernetes-1.30", args: []string{"--kube-version", "1.30.0"}, replicas: 3},
	{name: "admin-from-monitoring", args: []string{"--set-json", `networkPolicy.adminFrom=[{"namespaceSelector":{"matchLabels":{"kubernetes.io/metadata.name":"monitoring"}}}]`},
		replicas: 3, adminFrom: []networkingv1.NetworkPolicyPeer{{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}}}},
	{name: "oauth-behind-ingress", args: []string{"--set", "oauth.redirectURL=https://connectors.example.com/oauth/callback",
		"--set", "oauth.trustedProxies={10.244.0.0/16}", "--set", "oauth.ingress.enabled=true", "--set", "ports.oauth=8443"},
		replicas: 3, oauth: oauthWant{redirectURL: "https://connectors.example.com/oauth/callback", port: 8443, ingress: true}},
	{name: "oauth-backend-completes", args: []string{"--set", "oauth.redirectURL=https://chat.example.com/oauth/done",
		"--set", "oauth.serveCallback=false"}, replicas: 3, oauth: oauthWant{redirectURL: "https://chat.example.com/oauth/done"}},
	// The MCP endpoint with API keys (auth: keys, the default) over the gRPC certificate, at the defaults.
	{name: "mcp-keys-tls", args: []string{"--set", "mcp.enabled=true", "--set", "tls.enabled=true", "--set", "tls.existingSecret=connector-tls"},
		replicas: 3, mcp: mcpWant{port: 8090, maxBody: "4194304", rateLimit: "50", rateBurst: "100", tlsSecret: "connector-tls", serviceType: corev1.ServiceTypeClusterIP}},
	// auth none-any-address: something in front authenticates; the service (and the chart) allow plain HTTP.
	{name: "mcp-none-any-address", args: []string{"--set", "mcp.enabled=true", "--set", "auth=none-any-address", "--set-json", "mcp.rateLimit=0.5",
		"--set", "mcp.allowedOrigins={*}"},
		replicas: 3, mcp: mcpWant{port: 8090, origins: "*", maxBody: "4194304", rateLimit: "0.5", rateBurst: "100", serviceType: corev1.ServiceTypeClusterIP}},
}

func TestChartRendersValidObjects(t *testing.T) {
	known := binarySettings(t)
	for _, r := range renderings {
		t.Run(r.name, func(t *testing.T) {
			objs := decode(t, render(t, r.args...))
			if len(objs.deployments) != 1 {
				t.Fatalf("%d Deployments, want 1", len(objs.deployments))
			}
			d := objs.deployments[0]
			if got := *d.Spec.Replicas; got != r.replicas {
				t.Errorf("replicas %d, want %d", got, r.replicas)
			}
			c := theContainer(t, d)
			env := envOf(c)
			checkProbes(t, c, env)
			checkTerminationGrace(t, d, c, env)
			checkSecurity(t, d, c, env)
			checkReplicaIdentity(t, c, env)
			checkSecretsFromSecrets(t, c, objs.configMaps)
			checkSettingsKnown(t, known, c, objs.configMaps)
			checkServices(t, d, objs.services)
			checkPDB(t, d, objs.pdbs)
			checkNetworkPolicy(t, d, objs.netpols, r.adminFrom)
			checkPreStop(t, c, r.preStopExec)
			wantImage := r.image
			if wantImage == "" {
				wantImage = "registry.example.com/connector-svc:" + appVersion(t)
			}
			checkImage(t, c, wantImage)
			checkResources(t, c)
			checkOAuth(t, r.oauth, d, objs)
			checkMCP(t, r.mcp, d, objs)
			if len(objs.serviceMonitors) != r.serviceMonitors {
				t.Errorf("%d ServiceMonitors, want %d", len(objs.serviceMonitors), r.serviceMonitors)
			}
			for _, sm := range objs.serviceMonitors {
				checkServiceMonitor(t, sm, objs.services)
			}
			if got := len(dashboards(objs.configMaps)); got != r.dashboards {
				t.Errorf("%d dashboard ConfigMaps, want %d", got, r.dashboards)
			}
			for _, cm := range dashboards(objs.configMaps) {
				checkDashboard(t, cm)
			}
		})
	}
}

func theContainer(t *testing.T, d appsv1.Deployment) corev1.Container {
	t.Helper()
	cs := d.Spec.Template.Spec.Containers
	if len(cs) != 1 || cs[0].Name != "connector-svc" {
		t.Fatalf("containers %v, want one named connector-svc", cs)
	}
	if len(d.Spec.Template.Spec.InitContainers) != 0 {
		t.Fatalf("init containers are not checked here: %v", d.Spec.Template.Spec.InitContainers)
	}
	return cs[0]
}

func envOf(c corev1.Container) map[string]corev1.EnvVar {
	m := make(map[string]corev1.EnvVar, len(c.Env))
	for _, e := range c.Env {
		m[e.Name] = e
	}
	return m
}

func containerPort(t *testing.T, c corev1.Container, name string) int32 {
	t.Helper()
	for _, p := range c.Ports {
		if p.Name == name {
			return p.ContainerPort
		}
	}
	t.Fatalf("the container has no port named %q: %v", name, c.Ports)
	return 0
}

// portOf is the port of a host:port setting.
func portOf(t *testing.T, env map[string]corev1.EnvVar, name string) int32 {
	t.Helper()
	v := env[name].Value
	i := strings.LastIndex(v, ":")
	p, err := strconv.Atoi(v[i+1:])
	if i < 0 || err != nil {
		t.Fatalf("%s=%q is not host:port", name, v)
	}
	return int32(p)
}

// checkProbes: startup and readiness on /readyz, liveness on /healthz, all
// on the admin listener's port, which ADMIN_ADDR binds on every interface.
func checkProbes(t *testing.T, c corev1.Container, env map[string]corev1.EnvVar) {
	t.Helper()
	admin := containerPort(t, c, "admin")
	if got := portOf(t, env, "ADMIN_ADDR"); got != admin || !strings.HasPrefix(env["ADMIN_ADDR"].Value, "0.0.0.0:") {
		t.Errorf("ADMIN_ADDR=%q, want 0.0.0.0:%d", env["ADMIN_ADDR"].Value, admin)
	}
	if env["ADMIN_ANY_ADDRESS"].Value != "true" {
		t.Errorf("ADMIN_ANY_ADDRESS=%q: the service refuses ADMIN_ADDR off loopback without it", env["ADMIN_ANY_ADDRESS"].Value)
	}
	for _, p := range []struct {
		name  string
		probe *corev1.Probe
		path  string
	}{{"startupProbe", c.StartupProbe, "/readyz"}, {"readinessProbe", c.ReadinessProbe, "/readyz"}, {"livenessProbe", c.LivenessProbe, "/healthz"}} {
		if p.probe == nil || p.probe.HTTPGet == nil {
			t.Errorf("%s: none, or not HTTP: %+v", p.name, p.probe)
			continue
		}
		g := p.probe.HTTPGet
		if g.Path != p.path || g.Port.String() != "admin" || (g.Scheme != "" && g.Scheme != corev1.URISchemeHTTP) {
			t.Errorf("%s: %s %s on port %s, want HTTP %s on port admin (%d)", p.name, g.Scheme, g.Path, g.Port.String(), p.path, admin)
		}
		if p.probe.PeriodSeconds < 1 || p.probe.TimeoutSeconds < 1 || p.probe.FailureThreshold < 1 {
			t.Errorf("%s: timings %+v", p.name, p.probe.ProbeHandler)
		}
	}
}

// checkTerminationGrace: the pod gets at least preStop + SHUTDOWN_DELAY +
// SHUTDOWN_GRACE + the stdio kill grace before the kubelet kills it.
func checkTerminationGrace(t *testing.T, d appsv1.Deployment, c corev1.Container, env map[string]corev1.EnvVar) {
	t.Helper()
	grace, err := time.ParseDuration(env["SHUTDOWN_GRACE"].Value)
	if err != nil {
		t.Fatalf("SHUTDOWN_GRACE=%q: %v", env["SHUTDOWN_GRACE"].Value, err)
	}
	delay, err := time.ParseDuration(env["SHUTDOWN_DELAY"].Value)
	if err != nil {
		t.Fatalf("SHUTDOWN_DELAY=%q: %v", env["SHUTDOWN_DELAY"].Value, err)
	}
	var preStop time.Duration
	if c.Lifecycle != nil && c.Lifecycle.PreStop != nil {
		h := c.Lifecycle.PreStop
		switch {
		case h.Sleep != nil:
			preStop = time.Duration(h.Sleep.Seconds) * time.Second
		case h.Exec != nil && len(h.Exec.Command) == 3 && h.Exec.Command[0] == "connector-svc" && h.Exec.Command[1] == "sleep":
			n, err := strconv.Atoi(h.Exec.Command[2])
			if err != nil {
				t.Fatalf("preStop exec %v", h.Exec.Command)
			}
			preStop = time.Duration(n) * time.Second
		default:
			t.Fatalf("preStop is neither a sleep action nor `connector-svc sleep N`: %+v", h)
		}
	}
	if preStop < 5*time.Second {
		t.Errorf("preStop sleeps %v: endpoints are removed at the same time as SIGTERM arrives (kubernetes#67592)", preStop)
	}
	tgp := d.Spec.Template.Spec.TerminationGracePeriodSeconds
	if tgp == nil {
		t.Fatal("terminationGracePeriodSeconds unset")
	}
	if least := preStop + delay + grace + stdioKillWait; time.Duration(*tgp)*time.Second < least {
		t.Errorf("terminationGracePeriodSeconds %d < preStop %v + SHUTDOWN_DELAY %v + SHUTDOWN_GRACE %v + %v", *tgp, preStop, delay, grace, stdioKillWait)
	}
}

// checkSecurity: nothing privileged, non-root, read-only root filesystem, and
// writable emptyDirs for /tmp, HOME and npm's cache.
func checkSecurity(t *testing.T, d appsv1.Deployment, c corev1.Container, env map[string]corev1.EnvVar) {
	t.Helper()
	pod := d.Spec.Template.Spec
	sc := c.SecurityContext
	if sc == nil {
		t.Fatal("the container has no securityContext")
	}
	if sc.Privileged != nil && *sc.Privileged {
		t.Error("the container is privileged")
	}
	if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
		t.Error("allowPrivilegeEscalation is not false")
	}
	if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
		t.Error("readOnlyRootFilesystem is not true")
	}
	nonRoot := sc.RunAsNonRoot
	if nonRoot == nil && pod.SecurityContext != nil {
		nonRoot = pod.SecurityContext.RunAsNonRoot
	}
	if nonRoot == nil || !*nonRoot {
		t.Error("runAsNonRoot is not true")
	}
	if sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) || len(sc.Capabilities.Add) != 0 {
		t.Errorf("capabilities %+v, want drop [ALL] and add nothing", sc.Capabilities)
	}
	if sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("seccompProfile %+v, want RuntimeDefault", sc.SeccompProfile)
	}
	if pod.HostNetwork || pod.HostPID || pod.HostIPC {
		t.Error("the pod shares a host namespace")
	}
	emptyDirs := map[string]bool{}
	for _, v := range pod.Volumes {
		if v.EmptyDir != nil {
			emptyDirs[v.Name] = true
		}
		if v.HostPath != nil {
			t.Errorf("volume %s is a hostPath", v.Name)
		}
	}
	writable := map[string]bool{}
	for _, m := range c.VolumeMounts {
		if emptyDirs[m.Name] && !m.ReadOnly {
			writable[m.MountPath] = true
		}
	}
	for _, path := range []string{"/tmp", env["HOME"].Value, env["npm_config_cache"].Value} {
		if path == "" || !writable[path] {
			t.Errorf("%q is not a writable emptyDir mount (HOME=%q, npm_config_cache=%q)", path, env["HOME"].Value, env["npm_config_cache"].Value)
		}
	}
}

// checkReplicaIdentity: the pod's name is REPLICA_ID and its IP the
// advertised internal address, from the downward API; the internal and gRPC
// listeners bind the container's ports on every interface.
func checkReplicaIdentity(t *testing.T, c corev1.Container, env map[string]corev1.EnvVar) {
	t.Helper()
	for name, field := range downwardAPIOnly {
		e := env[name]
		if e.ValueFrom == nil || e.ValueFrom.FieldRef == nil || e.ValueFrom.FieldRef.FieldPath != field {
			t.Errorf("%s is not the downward API's %s: %+v", name, field, e)
		}
	}
	internal := containerPort(t, c, "internal")
	want := map[string]string{
		"REPLICA_ID":              "$(POD_NAME)",
		"INTERNAL_ADDR":           fmt.Sprintf("0.0.0.0:%d", internal),
		"INTERNAL_ADVERTISE_ADDR": fmt.Sprintf("$(POD_IP):%d", internal),
		"GRPC_ADDR":               fmt.Sprintf("0.0.0.0:%d", containerPort(t, c, "grpc")),
	}
	for name, v := range want {
		if env[name].Value != v {
			t.Errorf("%s=%q, want %q", name, env[name].Value, v)
		}
	}
	// POD_NAME and POD_IP must be defined before the variables that expand them.
	pos := map[string]int{}
	for i, e := range c.Env {
		pos[e.Name] = i
	}
	if pos["POD_NAME"] > pos["REPLICA_ID"] || pos["POD_IP"] > pos["INTERNAL_ADVERTISE_ADDR"] {
		t.Error("POD_NAME / POD_IP come after the variables that name them: Kubernetes would not expand $(…)")
	}
}

// checkSecretsFromSecrets: SECRET_KEY, DATABASE_URL and LLM_API_KEY are set
// only from Secrets, and no ConfigMap holds them.
func checkSecretsFromSecrets(t *testing.T, c corev1.Container, cms []corev1.ConfigMap) {
	t.Helper()
	for _, e := range c.Env {
		if slices.Contains(secretSettings, e.Name) && (e.Value != "" || e.ValueFrom == nil || e.ValueFrom.SecretKeyRef == nil) {
			t.Errorf("%s is not taken from a Secret", e.Name)
		}
	}
	for _, name := range secretSettings[:2] {
		if _, ok := envOf(c)[name]; !ok {
			t.Errorf("%s is not set", name)
		}
	}
	for _, cm := range cms {
		for k := range cm.Data {
			if slices.Contains(secretSettings, k) {
				t.Errorf("ConfigMap %s holds %s", cm.Name, k)
			}
		}
	}
}

// checkSettingsKnown: every variable the container gets (env, and the keys of
// the ConfigMaps it reads whole) is one the binary reads, or one of the
// downward-API helpers.
func checkSettingsKnown(t *testing.T, known settings, c corev1.Container, cms []corev1.ConfigMap) {
	t.Helper()
	names := []string{}
	for _, e := range c.Env {
		names = append(names, e.Name)
	}
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef == nil || from.Prefix != "" {
			t.Errorf("envFrom %+v: only whole ConfigMaps are checked here", from)
			continue
		}
		cm := findConfigMap(cms, from.ConfigMapRef.Name)
		if cm == nil {
			t.Errorf("envFrom names ConfigMap %s, which the chart does not render", from.ConfigMapRef.Name)
			continue
		}
		for k := range cm.Data {
			names = append(names, k)
		}
	}
	for _, n := range names {
		if _, ok := downwardAPIOnly[n]; ok {
			continue
		}
		if !known.has(n) {
			t.Errorf("the chart sets %s, which connector-svc does not read (-h, its stdio pass-through, the README's OTEL_* variables)", n)
		}
	}
}

func findConfigMap(cms []corev1.ConfigMap, name string) *corev1.ConfigMap {
	for i := range cms {
		if cms[i].Name == name {
			return &cms[i]
		}
	}
	return nil
}

// selects reports whether a selector's labels all sit on the pod template.
func selects(sel map[string]string, d appsv1.Deployment) bool {
	if len(sel) == 0 {
		return false
	}
	for k, v := range sel {
		if d.Spec.Template.Labels[k] != v {
			return false
		}
	}
	return true
}

// checkServices: a ClusterIP Service and a headless one on the gRPC port,
// both selecting the pods, and a metrics Service on the admin port.
func checkServices(t *testing.T, d appsv1.Deployment, svcs []corev1.Service) {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	grpc := containerPort(t, c, "grpc")
	var headless, clusterIP, metrics int
	for _, s := range svcs {
		if !selects(s.Spec.Selector, d) {
			t.Errorf("Service %s selects %v, not the pods", s.Name, s.Spec.Selector)
		}
		if len(s.Name) > 63 {
			t.Errorf("Service name %s is longer than 63", s.Name)
		}
		for _, p := range s.Spec.Ports {
			switch {
			case p.Name == "grpc" && p.Port == grpc && p.TargetPort.String() == "grpc" && s.Spec.ClusterIP == corev1.ClusterIPNone:
				headless++
				if s.Spec.PublishNotReadyAddresses {
					t.Errorf("headless Service %s publishes pods that are not ready", s.Name)
				}
			case p.Name == "grpc" && p.Port == grpc && p.TargetPort.String() == "grpc":
				clusterIP++
			case p.Name == "metrics" && p.TargetPort.String() == "admin":
				metrics++
			case p.Name == "oauth" && p.TargetPort.String() == "oauth" && len(s.Spec.Ports) == 1:
				// checkOAuth checks it; alone on its Service, which the public ingress routes to.
			case p.Name == "mcp" && p.TargetPort.String() == "mcp" && len(s.Spec.Ports) == 1:
				// checkMCP checks it; alone on its Service, which may be exposed without exposing gRPC.
			default:
				t.Errorf("Service %s port %+v", s.Name, p)
			}
		}
	}
	if headless != 1 || clusterIP != 1 || metrics != 1 {
		t.Errorf("headless gRPC Services %d, ClusterIP gRPC Services %d, metrics Services %d; want 1 each", headless, clusterIP, metrics)
	}
}

func checkPDB(t *testing.T, d appsv1.Deployment, pdbs []policyv1.PodDisruptionBudget) {
	t.Helper()
	if len(pdbs) != 1 {
		t.Fatalf("%d PodDisruptionBudgets, want 1", len(pdbs))
	}
	p := pdbs[0]
	if p.Spec.MaxUnavailable == nil || p.Spec.MaxUnavailable.String() != "1" || p.Spec.MinAvailable != nil {
		t.Errorf("PDB maxUnavailable %v minAvailable %v, want maxUnavailable 1", p.Spec.MaxUnavailable, p.Spec.MinAvailable)
	}
	if p.Spec.Selector == nil || !selects(p.Spec.Selector.MatchLabels, d) {
		t.Errorf("PDB selector %v does not select the pods", p.Spec.Selector)
	}
}

// checkNetworkPolicy: the internal port only from the release's pods, the
// admin port only from networkPolicy.adminFrom (nil: the default, every pod
// of the release's namespace and no other namespace), and nothing else but
// gRPC.
func checkNetworkPolicy(t *testing.T, d appsv1.Deployment, nps []networkingv1.NetworkPolicy, adminFrom []networkingv1.NetworkPolicyPeer) {
	t.Helper()
	if len(nps) != 1 {
		t.Fatalf("%d NetworkPolicies, want 1", len(nps))
	}
	np := nps[0]
	if !selects(np.Spec.PodSelector.MatchLabels, d) || !slices.Equal(np.Spec.PolicyTypes, []networkingv1.PolicyType{networkingv1.PolicyTypeIngress}) {
		t.Errorf("NetworkPolicy selects %v for %v", np.Spec.PodSelector.MatchLabels, np.Spec.PolicyTypes)
	}
	seen := map[string]bool{}
	for _, rule := range np.Spec.Ingress {
		if len(rule.Ports) != 1 || rule.Ports[0].Port == nil {
			t.Errorf("ingress rule %+v: want one named port", rule)
			continue
		}
		port := rule.Ports[0].Port.String()
		seen[port] = true
		switch port {
		case "grpc", "oauth", "mcp": // oauth: checkOAuth; mcp: checkMCP
		case "internal":
			if len(rule.From) != 1 || rule.From[0].NamespaceSelector != nil || rule.From[0].PodSelector == nil ||
				!cmp.Equal(rule.From[0].PodSelector.MatchLabels, np.Spec.PodSelector.MatchLabels) {
				t.Errorf("internal port reachable from %+v, want only the release's pods", rule.From)
			}
		case "admin":
			want := adminFrom
			if want == nil {
				want = []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}
			}
			if len(rule.From) == 0 {
				t.Error("admin port reachable from anywhere: a rule without from admits every source")
			} else if diff := cmp.Diff(want, rule.From); diff != "" {
				t.Errorf("admin port reachable from (-want +got):\n%s", diff)
			}
			for _, peer := range rule.From {
				if peer.NamespaceSelector != nil && len(peer.NamespaceSelector.MatchLabels) == 0 && len(peer.NamespaceSelector.MatchExpressions) == 0 && adminFrom == nil {
					t.Errorf("admin port reachable from every namespace by default: %+v", peer)
				}
			}
		default:
			t.Errorf("ingress to port %s", port)
		}
	}
	if !seen["grpc"] || !seen["internal"] || !seen["admin"] {
		t.Errorf("ingress rules for ports %v, want grpc, internal and admin", seen)
	}
}

// checkPreStop: the hook runs `sleep N` in the container when wantExec (preStop.exec, or a cluster before 1.30,
// where the native sleep action is off), and is the native sleep action otherwise.
func checkPreStop(t *testing.T, c corev1.Container, wantExec bool) {
	t.Helper()
	if c.Lifecycle == nil || c.Lifecycle.PreStop == nil {
		t.Fatal("no preStop hook")
	}
	h := c.Lifecycle.PreStop
	switch {
	case wantExec && (h.Exec == nil || h.Sleep != nil):
		t.Errorf("preStop %+v, want `sleep` run in the container (exec)", h)
	case !wantExec && (h.Sleep == nil || h.Exec != nil):
		t.Errorf("preStop %+v, want the native sleep action", h)
	}
}

// checkImage: the container runs the image named by the values.
func checkImage(t *testing.T, c corev1.Container, want string) {
	t.Helper()
	if c.Image != want {
		t.Errorf("image %q, want %q", c.Image, want)
	}
}

// checkResources: CPU and memory requests are set, so the scheduler counts
// the pods; no CPU limit (it would throttle the latency-bound gRPC path).
func checkResources(t *testing.T, c corev1.Container) {
	t.Helper()
	for _, name := range []corev1.ResourceName{corev1.ResourceCPU, corev1.ResourceMemory} {
		if q, ok := c.Resources.Requests[name]; !ok || q.Sign() <= 0 {
			t.Errorf("no %s request: %v", name, c.Resources.Requests)
		}
	}
	if _, ok := c.Resources.Limits[corev1.ResourceCPU]; ok {
		t.Errorf("a CPU limit: %v", c.Resources.Limits)
	}
}

// appVersion is Chart.yaml's appVersion, the image tag when image.tag is empty.
func appVersion(t *testing.T) string {
	t.Helper()
	var chart struct {
		AppVersion  string `json:"appVersion"`
		KubeVersion string `json:"kubeVersion"`
	}
	b, err := os.ReadFile(filepath.Join(chartDir, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, &chart); err != nil || chart.AppVersion == "" {
		t.Fatalf("Chart.yaml: appVersion %q: %v", chart.AppVersion, err)
	}
	return chart.AppVersion
}

// checkServiceMonitor: it scrapes /metrics on the metrics Service's port.
func checkServiceMonitor(t *testing.T, sm unstructured.Unstructured, svcs []corev1.Service) {
	t.Helper()
	if sm.GetNamespace() != namespace {
		t.Errorf("ServiceMonitor in namespace %q", sm.GetNamespace())
	}
	sel, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	eps, _, _ := unstructured.NestedSlice(sm.Object, "spec", "endpoints")
	if len(eps) != 1 {
		t.Fatalf("ServiceMonitor endpoints %v", eps)
	}
	ep, _ := eps[0].(map[string]any)
	if ep["port"] != "metrics" || ep["path"] != "/metrics" {
		t.Errorf("ServiceMonitor endpoint %v, want port metrics path /metrics", ep)
	}
	var matched []string
	for _, s := range svcs {
		ok := len(sel) > 0
		for k, v := range sel {
			ok = ok && s.Labels[k] == v
		}
		if ok {
			matched = append(matched, s.Name)
			if s.Spec.Ports[0].Name != "metrics" {
				t.Errorf("ServiceMonitor selects Service %s, which has no metrics port", s.Name)
			}
		}
	}
	if len(matched) != 1 {
		t.Errorf("ServiceMonitor selects Services %v, want the metrics Service alone", matched)
	}
}

func dashboards(cms []corev1.ConfigMap) []corev1.ConfigMap {
	var out []corev1.ConfigMap
	for _, cm := range cms {
		if _, ok := cm.Data["connector-svc.json"]; ok {
			out = append(out, cm)
		}
	}
	return out
}

// checkDashboard: the ConfigMap carries deploy/grafana's dashboard, as JSON.
func checkDashboard(t *testing.T, cm corev1.ConfigMap) {
	t.Helper()
	want, err := os.ReadFile("../grafana/connector-svc.json")
	if err != nil {
		t.Fatal(err)
	}
	got := cm.Data["connector-svc.json"]
	if strings.TrimSpace(got) != strings.TrimSpace(string(want)) {
		t.Error("the dashboard ConfigMap differs from deploy/grafana/connector-svc.json")
	}
	if !json.Valid([]byte(got)) {
		t.Error("the dashboard ConfigMap's JSON does not parse")
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("dashboard labels %v: Grafana's sidecar looks for grafana_dashboard", cm.Labels)
	}
}

// TestChartDashboardIsTheRepositorysDashboard: the chart carries a copy of
// deploy/grafana/connector-svc.json (helm packages no file outside the chart);
// this keeps the two equal.
func TestChartDashboardIsTheRepositorysDashboard(t *testing.T) {
	want, err := os.ReadFile("../grafana/connector-svc.json")
	if err != nil {
		t.Fatal(err)
	}
	got, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "connector-svc.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("deploy/helm/connector-svc/dashboards/connector-svc.json differs from deploy/grafana/connector-svc.json: cp deploy/grafana/connector-svc.json deploy/helm/connector-svc/dashboards/")
	}
}

// TestChartRequiresImageRepository: no image is published, so without
// image.repository helm template and helm install fail, saying which value to
// set and how to build and push the image. (helm lint passes: in lint mode
// `required` lets an empty value through.)
func TestChartRequiresImageRepository(t *testing.T) {
	for _, args := range [][]string{
		{"template", release, chartDir, "--kube-version", kubeVersion},
		{"template", release, chartDir, "--kube-version", kubeVersion, "--set", "image.repository="},
		{"template", release, chartDir, "--kube-version", kubeVersion, "--set", "image.tag=v1", "--set", "image.digest=sha256:" + strings.Repeat("ab", 32)},
	} {
		out, stderr, err := helmBare(t, args...)
		if err == nil {
			t.Errorf("helm %v passed without image.repository:\n%s", args, out)
			continue
		}
		for _, want := range []string{"image.repository is required", "make image-push KO_DOCKER_REPO=", "set image.repository="} {
			if !strings.Contains(out+stderr, want) {
				t.Errorf("helm %v failed without %q:\n%s%s", args, want, out, stderr)
			}
		}
	}
	// A repository with its tag in it, or a space, is refused by the schema.
	for _, repo := range []string{"registry.example.com/connector-svc:v1", "registry.example.com/connector svc"} {
		if _, stderr, err := helm(t, "template", release, chartDir, "--set", "image.repository="+repo); err == nil || !strings.Contains(stderr, "/image/repository") {
			t.Errorf("image.repository=%q: %v\n%s; want it refused by the schema", repo, err, stderr)
		}
	}
	for _, repo := range []string{"connector-svc", "registry.example.com:5000/team/connector-svc", "ko.local/connector-svc"} {
		out := render(t, "--set", "image.repository="+repo)
		if got := theContainer(t, decode(t, out).deployments[0]).Image; got != repo+":"+appVersion(t) {
			t.Errorf("image.repository=%s: image %q", repo, got)
		}
	}
}

// TestChartKubeVersion: Chart.yaml's kubeVersion refuses clusters the chart's
// objects do not fit; the preStop hook follows the cluster's version
// (TestChartRendersValidObjects: kubernetes-1.29 and kubernetes-1.30).
func TestChartKubeVersion(t *testing.T) {
	_, stderr, err := helm(t, "template", release, chartDir, "--kube-version", "1.24.9")
	if err == nil || !strings.Contains(stderr, "chart requires kubeVersion: >=1.25.0-0") {
		t.Errorf("Kubernetes 1.24: %v\n%s; want helm to refuse it by the chart's kubeVersion", err, stderr)
	}
	// A provider's pre-release or build suffix still counts as its version.
	for version, exec := range map[string]bool{"1.25.0": true, "1.29.15-gke.1234": true, "1.30.0-eks-1.30": false, "1.34.1": false} {
		c := theContainer(t, decode(t, render(t, "--kube-version", version)).deployments[0])
		checkPreStop(t, c, exec)
	}
}

// TestChartAdminFromIsNeverEmpty: an empty networkPolicy.adminFrom would be a
// rule without peers, which admits every source; it is refused.
func TestChartAdminFromIsNeverEmpty(t *testing.T) {
	_, stderr, err := helm(t, "template", release, chartDir, "--set-json", "networkPolicy.adminFrom=[]")
	if err == nil || !strings.Contains(stderr, "adminFrom") {
		t.Errorf("networkPolicy.adminFrom=[]: %v\n%s; want it refused, named", err, stderr)
	}
	// With the NetworkPolicy off there is no rule, and nothing to refuse.
	if _, stderr, err := helm(t, "template", release, chartDir, "--set", "networkPolicy.enabled=false"); err != nil {
		t.Errorf("networkPolicy.enabled=false: %v\n%s", err, stderr)
	}
}

// TestChartRefusesShortTerminationGrace: a terminationGracePeriodSeconds below
// preStop + SHUTDOWN_GRACE + the stdio kill grace fails helm template, naming
// the least; the least itself renders.
func TestChartRefusesShortTerminationGrace(t *testing.T) {
	for _, tc := range []struct {
		set   []string
		least int
	}{
		{set: nil, least: 22}, // 10 + 10 + 2
		{set: []string{"--set", "preStop.sleepSeconds=5", "--set", "shutdownGraceSeconds=130"}, least: 137},
	} {
		args := append([]string{"template", release, chartDir}, tc.set...)
		_, stderr, err := helm(t, append(args, "--set", fmt.Sprintf("terminationGracePeriodSeconds=%d", tc.least-1))...)
		if err == nil {
			t.Fatalf("%v terminationGracePeriodSeconds=%d rendered", tc.set, tc.least-1)
		}
		want := fmt.Sprintf("terminationGracePeriodSeconds=%d is too short: it must be at least", tc.least-1)
		if !strings.Contains(stderr, want) || !strings.Contains(stderr, fmt.Sprintf("= %d,", tc.least)) {
			t.Errorf("%v: helm template failed with\n%s\nwant %q and the least, %d", tc.set, stderr, want, tc.least)
		}
		out := render(t, append(tc.set, "--set", fmt.Sprintf("terminationGracePeriodSeconds=%d", tc.least))...)
		if tgp := *decode(t, out).deployments[0].Spec.Template.Spec.TerminationGracePeriodSeconds; tgp != int64(tc.least) {
			t.Errorf("%v: terminationGracePeriodSeconds %d, want %d", tc.set, tgp, tc.least)
		}
	}
}

// TestChartRefusesSettingsItOwns: a secret, a setting the chart sets itself, or
// a name the binary does not read is refused in `config`; a setting the chart
// sets itself is refused in `extraEnv` too.
func TestChartRefusesSettingsItOwns(t *testing.T) {
	for _, key := range []string{"SECRET_KEY", "DATABASE_URL", "LLM_API_KEY", "GRPC_ADDR", "REPLICA_ID", "SHUTDOWN_GRACE", "SHUTDOWN_DELAY", "NO_SUCH_SETTING"} {
		_, stderr, err := helm(t, "template", release, chartDir, "--set", "config."+key+"=x")
		if err == nil {
			t.Errorf("config.%s rendered", key)
		} else if !strings.Contains(stderr, key) {
			t.Errorf("config.%s refused without naming it:\n%s", key, stderr)
		}
	}
	// In extraEnv, a name the chart sets would be a second entry, and win.
	_, stderr, err := helm(t, "template", release, chartDir, "--set", "extraEnv[0].name=AUTH", "--set", "extraEnv[0].value=none")
	if err == nil || !strings.Contains(stderr, "extraEnv AUTH") {
		t.Errorf("extraEnv AUTH: %v\n%s; want it refused, named", err, stderr)
	}
}

// TestChartCoversEverySetting: every setting the binary reads can be set
// through the chart: it is a key `config` accepts (values.schema.json), or the
// chart sets it with every option on; and every key `config` accepts is one
// the binary reads.
func TestChartCoversEverySetting(t *testing.T) {
	known := binarySettings(t)
	accepted, pattern := configKeys(t)
	objs := decode(t, render(t, "-f", allOnValues))
	set := map[string]bool{}
	for _, e := range objs.deployments[0].Spec.Template.Spec.Containers[0].Env {
		set[e.Name] = true
	}
	for _, cm := range objs.configMaps {
		for k := range cm.Data {
			set[k] = true
		}
	}
	for _, n := range known.own {
		if !slices.Contains(accepted, n) && !set[n] {
			t.Errorf("%s (connector-svc -h) cannot be set through the chart", n)
		}
	}
	for _, n := range accepted {
		if !known.has(n) {
			t.Errorf("values.schema.json accepts config.%s, which connector-svc does not read", n)
		}
	}
	if !slices.ContainsFunc(known.prefixes, func(p string) bool { return strings.HasPrefix(strings.TrimPrefix(pattern, "^"), p) }) {
		t.Errorf("config's pattern %q is within none of %v", pattern, known.prefixes)
	}
}

// configKeys reads the names values.schema.json accepts in `config`: an enum
// and a pattern.
func configKeys(t *testing.T) ([]string, string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties struct {
			Config struct {
				PropertyNames struct {
					AnyOf []struct {
						Enum    []string `json:"enum"`
						Pattern string   `json:"pattern"`
					} `json:"anyOf"`
				} `json:"propertyNames"`
			} `json:"config"`
		} `json:"properties"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	var enum []string
	var pattern string
	for _, a := range schema.Properties.Config.PropertyNames.AnyOf {
		enum = append(enum, a.Enum...)
		if a.Pattern != "" {
			pattern = a.Pattern
		}
	}
	if len(enum) == 0 || pattern == "" {
		t.Fatal("values.schema.json: config.propertyNames.anyOf has no enum or no pattern")
	}
	return enum, pattern
}

// settings are the environment variables connector-svc reads: exact names,
// and prefixes (OTEL_EXPORTER_OTLP_*).
type settings struct {
	own      []string // the binary's own settings: each flag's (NAME) and the environment-only ones of -h
	exact    []string
	prefixes []string
}

func (s settings) has(name string) bool {
	if slices.Contains(s.exact, name) {
		return true
	}
	for _, p := range s.prefixes {
		if strings.HasPrefix(name, p) {
			return true
		}
	}
	return false
}

var buildOnce = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "helm-test-bin")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "connector-svc")
	if out, err := exec.Command("go", "build", "-o", bin, "../../cmd/connector-svc").CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

func TestMain(m *testing.M) {
	code := m.Run()
	if bin, err := buildOnce(); err == nil {
		os.RemoveAll(filepath.Dir(bin))
	}
	os.Exit(code)
}

var (
	flagEnv  = regexp.MustCompile(`\(([A-Z][A-Z0-9_]+)\)`)
	envOnly  = regexp.MustCompile(`(?m)^  ([A-Z][A-Z0-9_]+\*?)  `)
	otelName = regexp.MustCompile(`\bOTEL_[A-Z0-9_]+\*?`)
)

// binarySettings collects what connector-svc reads: each flag's "(NAME)" and
// the environment-only names its -h prints, the OTEL_* variables of -h and of
// the README's configuration table, and the service's variables a stdio
// server inherits (internal/registry/stdio's envPassThrough: HOME,
// npm_config_cache, …).
func binarySettings(t *testing.T) settings {
	t.Helper()
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := exec.Command(bin, "-h").CombinedOutput() // -h exits non-zero on some flag packages; the text is what counts
	help := string(out)
	if !strings.Contains(help, "(GRPC_ADDR)") || !strings.Contains(help, "Environment only") {
		t.Fatalf("connector-svc -h does not list its settings as expected:\n%s", help)
	}
	var s settings
	add := func(n string) {
		if strings.HasSuffix(n, "*") {
			if !slices.Contains(s.prefixes, strings.TrimSuffix(n, "*")) {
				s.prefixes = append(s.prefixes, strings.TrimSuffix(n, "*"))
			}
		} else if !slices.Contains(s.exact, n) {
			s.exact = append(s.exact, n)
		}
	}
	for _, m := range flagEnv.FindAllStringSubmatch(help, -1) {
		add(m[1])
	}
	for _, m := range envOnly.FindAllStringSubmatch(help, -1) {
		add(m[1])
	}
	s.own = slices.Clone(s.exact)
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range otelName.FindAllString(help+string(configurationSection(t, string(readme))), -1) {
		add(n)
	}
	for _, n := range stdioPassThrough(t) {
		add(n)
	}
	for _, must := range []string{"SECRET_KEY", "DATABASE_URL", "LLM_API_KEY", "SHUTDOWN_GRACE", "OTEL_TRACES_EXPORTER", "HOME"} {
		if !s.has(must) {
			t.Fatalf("collected %v, missing %s: has -h, the README or internal/registry changed shape?", s, must)
		}
	}
	return s
}

// configurationSection is the README's "## Configuration" section.
func configurationSection(t *testing.T, readme string) string {
	t.Helper()
	_, rest, ok := strings.Cut(readme, "\n## Configuration\n")
	if !ok {
		t.Fatal(`README.md has no "## Configuration" section`)
	}
	section, _, _ := strings.Cut(rest, "\n## ")
	return section
}

// stdioPassThrough reads internal/registry/stdio's envPassThrough, the
// variables of the service's environment a stdio server inherits.
func stdioPassThrough(t *testing.T) []string {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "../../internal/registry/stdio/stdio.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || len(vs.Names) != 1 || vs.Names[0].Name != "envPassThrough" || len(vs.Values) != 1 {
			return true
		}
		lit, ok := vs.Values[0].(*ast.CompositeLit)
		if !ok {
			return true
		}
		for _, e := range lit.Elts {
			if b, ok := e.(*ast.BasicLit); ok && b.Kind == token.STRING {
				s, _ := strconv.Unquote(b.Value)
				names = append(names, s)
			}
		}
		return false
	})
	if !slices.Contains(names, "HOME") || !slices.Contains(names, "npm_config_cache") {
		t.Fatalf("internal/registry/stdio/stdio.go envPassThrough = %v: HOME and npm_config_cache no longer reach stdio servers?", names)
	}
	return names
}

// TestChartRefusesBadValues: values.schema.json checks the form of the
// settings it can (durations, whole numbers, log levels), so a typo fails
// `helm template` naming the key, not a pod in CrashLoopBackOff.
func TestChartRefusesBadValues(t *testing.T) {
	for _, set := range []string{"config.LOG_LEVEL=verbose", "config.HEALTH_INTERVAL=10", "config.REPLICA_TTL=soon",
		"config.NARROW_TOOLS_TO=0", "config.ADMIN_PPROF=yes"} {
		_, stderr, err := helm(t, "template", release, chartDir, "--set", set)
		key := strings.TrimPrefix(strings.SplitN(set, "=", 2)[0], "config.")
		if err == nil {
			t.Errorf("%s rendered", set)
		} else if !strings.Contains(stderr, key) {
			t.Errorf("%s refused without naming %s:\n%s", set, key, stderr)
		}
	}
	if _, stderr, err := helm(t, "template", release, chartDir, "--set", "config.HEALTH_INTERVAL=1m30s",
		"--set", "config.NARROW_TOOLS_TO=24", "--set", "config.LOG_LEVEL=debug"); err != nil {
		t.Errorf("good values refused: %v\n%s", err, stderr)
	}
}

// checkOAuth: with OAuth off, nothing of it is rendered. With a redirect URL,
// every replica gets it. With the callback listener, each binds its named
// port on every interface; a Service of that port alone (no gRPC) selects
// them for the public ingress; the NetworkPolicy lets the ingress reach it;
// its certificate, if any, comes read-only from the Secret, mounted whole;
// and the Ingress, if any, routes only the public paths, to that Service.
func checkOAuth(t *testing.T, want oauthWant, d appsv1.Deployment, objs objects) {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	settings := map[string]string{} // as the process sees them: the ConfigMaps, then env
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef != nil {
			if cm := findConfigMap(objs.configMaps, from.ConfigMapRef.Name); cm != nil {
				maps.Copy(settings, cm.Data)
			}
		}
	}
	for _, e := range c.Env {
		settings[e.Name] = e.Value
	}
	if want.redirectURL == "" {
		for n := range settings {
			if strings.HasPrefix(n, "OAUTH_") {
				t.Errorf("OAuth is off, yet the chart sets %s", n)
			}
		}
	} else if got := settings["OAUTH_REDIRECT_URL"]; got != want.redirectURL {
		t.Errorf("OAUTH_REDIRECT_URL=%q, want %q", got, want.redirectURL)
	}
	if got := settings["OAUTH_CLIENT_METADATA_URL"]; got != want.metadataURL {
		t.Errorf("OAUTH_CLIENT_METADATA_URL=%q, want %q", got, want.metadataURL)
	}

	var port int32
	for _, p := range c.Ports {
		if p.Name == "oauth" {
			port = p.ContainerPort
		}
	}
	wantAddr := ""
	if want.port != 0 {
		wantAddr = fmt.Sprintf("0.0.0.0:%d", want.port)
	}
	if port != want.port || settings["OAUTH_CALLBACK_ADDR"] != wantAddr {
		t.Errorf("container port oauth %d, OAUTH_CALLBACK_ADDR=%q; want %d and %q", port, settings["OAUTH_CALLBACK_ADDR"], want.port, wantAddr)
	}

	var svcs []corev1.Service
	for _, s := range objs.services {
		if slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "oauth" || p.TargetPort.String() == "oauth" }) {
			svcs = append(svcs, s)
		}
	}
	var rules []networkingv1.NetworkPolicyIngressRule
	for _, np := range objs.netpols {
		for _, rule := range np.Spec.Ingress {
			if slices.ContainsFunc(rule.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port != nil && p.Port.String() == "oauth" }) {
				rules = append(rules, rule)
			}
		}
	}
	if want.port == 0 {
		if len(svcs) != 0 || len(rules) != 0 || len(objs.ingresses) != 0 {
			t.Errorf("no callback listener, yet %d Services, %d NetworkPolicy rules and %d Ingresses for it", len(svcs), len(rules), len(objs.ingresses))
		}
		if settings["OAUTH_CALLBACK_TLS_CERT_FILE"] != "" || settings["OAUTH_CALLBACK_TLS_KEY_FILE"] != "" {
			t.Error("no callback listener, yet its certificate is set")
		}
		return
	}
	if len(svcs) != 1 {
		t.Fatalf("%d Services on the callback port, want 1", len(svcs))
	}
	svc := svcs[0]
	wantProto := "http"
	if want.tlsSecret != "" {
		wantProto = "https"
	}
	if p := svc.Spec.Ports[0]; len(svc.Spec.Ports) != 1 || p.Port != want.port || p.Protocol != corev1.ProtocolTCP ||
		p.AppProtocol == nil || *p.AppProtocol != wantProto {
		t.Errorf("callback Service %s ports %+v, want the oauth port (%d, %s) alone: the public ingress must reach nothing else", svc.Name, svc.Spec.Ports, want.port, wantProto)
	}
	if svc.Spec.ClusterIP == corev1.ClusterIPNone || !selects(svc.Spec.Selector, d) {
		t.Errorf("callback Service %s: clusterIP %q, selector %v; want a virtual IP over the pods", svc.Name, svc.Spec.ClusterIP, svc.Spec.Selector)
	}
	if len(rules) != 1 || len(rules[0].Ports) != 1 || len(rules[0].From) != want.from {
		t.Errorf("NetworkPolicy rules for the callback port %+v, want one, from %d peers (0: anywhere)", rules, want.from)
	}

	cert, key := settings["OAUTH_CALLBACK_TLS_CERT_FILE"], settings["OAUTH_CALLBACK_TLS_KEY_FILE"]
	if want.tlsSecret == "" && (cert != "" || key != "") {
		t.Errorf("OAUTH_CALLBACK_TLS_CERT_FILE=%q, OAUTH_CALLBACK_TLS_KEY_FILE=%q without a Secret", cert, key)
	}
	if want.tlsSecret != "" {
		if cert == "" || key == "" || cert == key {
			t.Errorf("OAUTH_CALLBACK_TLS_CERT_FILE=%q, OAUTH_CALLBACK_TLS_KEY_FILE=%q; want two files of Secret %s", cert, key, want.tlsSecret)
		}
		for _, file := range []string{cert, key} {
			checkSecretFile(t, d, c, file, want.tlsSecret)
		}
	}

	if !want.ingress {
		if len(objs.ingresses) != 0 {
			t.Errorf("%d Ingresses, want none", len(objs.ingresses))
		}
		return
	}
	if len(objs.ingresses) != 1 {
		t.Fatalf("%d Ingresses, want 1", len(objs.ingresses))
	}
	ing := objs.ingresses[0]
	if ing.Spec.DefaultBackend != nil {
		t.Errorf("Ingress %s has a default backend: it routes more than the callback", ing.Name)
	}
	wantRoutes := map[string][]string{}
	for _, raw := range []string{want.redirectURL, want.metadataURL} {
		if raw == "" {
			continue
		}
		u, err := url.Parse(raw)
		if err != nil {
			t.Fatal(err)
		}
		wantRoutes[u.Hostname()] = append(wantRoutes[u.Hostname()], u.Path)
	}
	routes := map[string][]string{}
	for _, rule := range ing.Spec.Rules {
		if rule.HTTP == nil {
			t.Errorf("Ingress rule for %q routes no paths", rule.Host)
			continue
		}
		for _, p := range rule.HTTP.Paths {
			routes[rule.Host] = append(routes[rule.Host], p.Path)
			if b := p.Backend.Service; b == nil || b.Name != svc.Name || b.Port.Name != "oauth" {
				t.Errorf("Ingress path %s%s goes to %+v, want Service %s port oauth", rule.Host, p.Path, p.Backend, svc.Name)
			}
			if p.PathType == nil || *p.PathType != networkingv1.PathTypeExact {
				t.Errorf("Ingress path %s%s of type %v, want Exact", rule.Host, p.Path, p.PathType)
			}
		}
	}
	if diff := cmp.Diff(wantRoutes, routes); diff != "" {
		t.Errorf("Ingress routes (-want +got):\n%s", diff)
	}
	for _, tls := range ing.Spec.TLS {
		for host := range wantRoutes {
			if !slices.Contains(tls.Hosts, host) {
				t.Errorf("Ingress TLS %s does not cover %s", tls.SecretName, host)
			}
		}
	}
}

// checkSecretFile: file is in a read-only mount, not a subPath (Kubernetes
// never updates those: a renewed certificate would not arrive), of a volume of
// the Secret that has an item at that path.
func checkSecretFile(t *testing.T, d appsv1.Deployment, c corev1.Container, file, secret string) {
	t.Helper()
	for _, m := range c.VolumeMounts {
		rel, ok := strings.CutPrefix(file, strings.TrimSuffix(m.MountPath, "/")+"/")
		if !ok {
			continue
		}
		if !m.ReadOnly || m.SubPath != "" {
			t.Errorf("%s: mount %+v, want read-only and whole", file, m)
		}
		for _, v := range d.Spec.Template.Spec.Volumes {
			if v.Name != m.Name {
				continue
			}
			if v.Secret == nil || v.Secret.SecretName != secret ||
				!slices.ContainsFunc(v.Secret.Items, func(k corev1.KeyToPath) bool { return k.Path == rel }) {
				t.Errorf("%s: volume %+v, want Secret %s with an item at %s", file, v.VolumeSource, secret, rel)
			}
			return
		}
		t.Errorf("%s: mount of volume %s, which the pod does not have", file, m.Name)
		return
	}
	t.Errorf("%s is in no volume mount", file)
}

// mcpSettings are the settings the chart renders for the MCP endpoint.
var mcpSettings = []string{"MCP_ADDR", "MCP_ALLOWED_ORIGINS", "MCP_MAX_BODY_BYTES", "MCP_RATE_LIMIT", "MCP_RATE_BURST"}

// checkMCP: off, the pods get no MCP setting and no mcp port, and no Service
// or NetworkPolicy rule names one. On, every pod binds MCP_ADDR on every
// interface at the container's port mcp, with the values' settings; the
// `<fullname>-mcp` Service carries that port alone; the NetworkPolicy admits
// it from networkPolicy.mcpFrom; and the pod has what the service demands of
// an MCP_ADDR off loopback: TLS from the gRPC certificate and API keys, or
// AUTH=none-any-address. The probes stay on the admin port (checkProbes).
func checkMCP(t *testing.T, want mcpWant, d appsv1.Deployment, objs objects) {
	t.Helper()
	c := d.Spec.Template.Spec.Containers[0]
	settings := map[string]string{} // as the process sees them: the ConfigMaps, then env
	for _, from := range c.EnvFrom {
		if from.ConfigMapRef != nil {
			if cm := findConfigMap(objs.configMaps, from.ConfigMapRef.Name); cm != nil {
				maps.Copy(settings, cm.Data)
			}
		}
	}
	for _, e := range c.Env {
		settings[e.Name] = e.Value
	}
	var services []corev1.Service
	for _, s := range objs.services {
		if slices.ContainsFunc(s.Spec.Ports, func(p corev1.ServicePort) bool { return p.Name == "mcp" || p.TargetPort.String() == "mcp" }) {
			services = append(services, s)
		}
	}
	var rules []networkingv1.NetworkPolicyIngressRule
	for _, np := range objs.netpols {
		for _, r := range np.Spec.Ingress {
			if slices.ContainsFunc(r.Ports, func(p networkingv1.NetworkPolicyPort) bool { return p.Port != nil && p.Port.String() == "mcp" }) {
				rules = append(rules, r)
			}
		}
	}
	if want.port == 0 {
		for _, n := range mcpSettings {
			if v, ok := settings[n]; ok {
				t.Errorf("the MCP endpoint is off, yet the chart sets %s=%q", n, v)
			}
		}
		if slices.ContainsFunc(c.Ports, func(p corev1.ContainerPort) bool { return p.Name == "mcp" }) {
			t.Errorf("the MCP endpoint is off, yet the container has port mcp: %v", c.Ports)
		}
		for _, s := range services {
			t.Errorf("the MCP endpoint is off, yet Service %s has an mcp port", s.Name)
		}
		if len(rules) != 0 {
			t.Errorf("the MCP endpoint is off, yet the NetworkPolicy admits port mcp: %+v", rules)
		}
		return
	}
	if got := containerPort(t, c, "mcp"); got != want.port {
		t.Errorf("container port mcp %d, want %d", got, want.port)
	}
	if got, w := settings["MCP_ADDR"], fmt.Sprintf("0.0.0.0:%d", want.port); got != w {
		t.Errorf("MCP_ADDR=%q, want %q (every replica serves it)", got, w)
	}
	for n, w := range map[string]string{"MCP_ALLOWED_ORIGINS": want.origins, "MCP_MAX_BODY_BYTES": want.maxBody,
		"MCP_RATE_LIMIT": want.rateLimit, "MCP_RATE_BURST": want.rateBurst} {
		if got, ok := settings[n]; got != w || (w == "" && ok) {
			t.Errorf("%s=%q, want %q", n, got, w)
		}
	}
	// The service's rule for an MCP_ADDR off loopback (cmd/connector-svc/mcp.go).
	if settings["AUTH"] != "none-any-address" && (settings["TLS_CERT_FILE"] == "" || settings["AUTH"] != "keys") {
		t.Errorf("MCP_ADDR=%s with AUTH=%q and TLS_CERT_FILE=%q: the service refuses it", settings["MCP_ADDR"], settings["AUTH"], settings["TLS_CERT_FILE"])
	}
	if want.tlsSecret == "" {
		if f := settings["TLS_CERT_FILE"]; f != "" {
			t.Errorf("TLS_CERT_FILE=%s, want the endpoint on plain HTTP", f)
		}
	} else {
		for _, n := range []string{"TLS_CERT_FILE", "TLS_KEY_FILE"} {
			checkSecretFile(t, d, c, settings[n], want.tlsSecret)
		}
	}
	if len(services) != 1 {
		t.Fatalf("%d Services with an mcp port, want 1", len(services))
	}
	s := services[0]
	if s.Name != release+"-connector-svc-mcp" && s.Name != "connector-mcp" { // the all-on values' fullnameOverride
		t.Errorf("the MCP Service is %s, want <fullname>-mcp", s.Name)
	}
	if s.Spec.Type != want.serviceType {
		t.Errorf("Service %s type %s, want %s", s.Name, s.Spec.Type, want.serviceType)
	}
	if s.Spec.ClusterIP == corev1.ClusterIPNone || !selects(s.Spec.Selector, d) {
		t.Errorf("Service %s: clusterIP %q, selector %v; want a balanced Service of the pods", s.Name, s.Spec.ClusterIP, s.Spec.Selector)
	}
	p := s.Spec.Ports[0]
	wantProto := map[bool]string{true: "https", false: "http"}[want.tlsSecret != ""]
	if len(s.Spec.Ports) != 1 || p.Name != "mcp" || p.Port != want.port || p.TargetPort.String() != "mcp" ||
		p.AppProtocol == nil || *p.AppProtocol != wantProto {
		t.Errorf("Service %s ports %+v, want mcp %d to the pods' port mcp, alone, appProtocol %s", s.Name, s.Spec.Ports, want.port, wantProto)
	}
	if len(rules) != 1 {
		t.Fatalf("%d NetworkPolicy rules admit port mcp, want 1", len(rules))
	}
	if len(rules[0].Ports) != 1 || len(rules[0].From) != want.from {
		t.Errorf("the mcp rule: ports %+v from %+v, want port mcp alone from %d peers (0: anywhere)", rules[0].Ports, rules[0].From, want.from)
	}
}

// TestChartRefusesMCPWithoutTLS: the MCP endpoint on every pod interface with
// auth=keys and no TLS is what connector-svc refuses at start-up; helm
// template refuses it first, saying what to set. The test also runs the binary
// on that environment to show the chart refuses what the service would.
func TestChartRefusesMCPWithoutTLS(t *testing.T) {
	for _, set := range [][]string{
		{"--set", "mcp.enabled=true"},
		{"--set", "mcp.enabled=true", "--set", "auth=keys", "--set", "tls.enabled=false", "--set", "tls.existingSecret=connector-tls"},
		{"-f", allOnValues, "--set", "auth=keys", "--set", "tls.enabled=false"},
	} {
		_, stderr, err := helm(t, append([]string{"template", release, chartDir}, set...)...)
		if err == nil {
			t.Errorf("%v rendered", set)
			continue
		}
		for _, want := range []string{"mcp.enabled: every pod would serve the MCP endpoint", "(auth=keys)",
			"set tls.enabled=true and tls.existingSecret=", "or auth=none-any-address"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("%v refused without %q:\n%s", set, want, stderr)
			}
		}
	}
	// The service refuses the environment the chart would have rendered.
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	env := podEnv(t, decode(t, render(t)))
	cmd := exec.Command(bin, "migrate")
	cmd.Env = append(env, "MCP_ADDR=0.0.0.0:8090")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), "refusing MCP_ADDR 0.0.0.0:8090") {
		t.Errorf("connector-svc with AUTH=keys, no TLS and MCP_ADDR=0.0.0.0:8090: %v\n%s\nwant it refused", err, out)
	}
}

// TestChartRefusesBadMCPValues: the MCP values are checked when rendered.
func TestChartRefusesBadMCPValues(t *testing.T) {
	on := []string{"--set", "mcp.enabled=true", "--set", "auth=none-any-address"}
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{append(on, "--set", "mcp.allowedOrigins={https://chat.example.com/}"), "/mcp/allowedOrigins/0"}, // browsers send no slash
		{append(on, "--set", "mcp.allowedOrigins={chat.example.com}"), "/mcp/allowedOrigins/0"},
		{append(on, "--set", "mcp.allowedOrigins={https://a.example.com,https://b.example.com/app}"), "/mcp/allowedOrigins/1"},
		{append(on, "--set", "mcp.maxBodyBytes=0"), "/mcp/maxBodyBytes"},
		{append(on, "--set", "mcp.rateLimit=-1"), "/mcp/rateLimit"},
		{append(on, "--set", "mcp.rateLimit=fast"), "/mcp/rateLimit"},
		{append(on, "--set", "mcp.rateBurst=-1"), "/mcp/rateBurst"},
		{append(on, "--set", "mcp.service.type=ExternalName"), "/mcp/service/type"},
		{append(on, "--set", "mcp.enable=true"), "enable"},
		{append(on, "--set", "ports.mcp=0"), "/ports/mcp"},
		{append(on, "--set", "ports.mcp=50051"), "ports.mcp=50051 is ports.grpc too"},
		{append(on, "--set", "ports.mcp=9464"), "ports.mcp=9464 is ports.admin too"},
		{append(on, "--set", "ports.mcp=8081", "--set", "oauth.redirectURL=https://connectors.example.com/oauth/callback"), "ports.mcp=8081 is ports.oauth too"},
		{[]string{"--set", "config.MCP_ADDR=0.0.0.0:8090"}, "MCP_ADDR"},
		{[]string{"--set", "config.MCP_RATE_LIMIT=5"}, "MCP_RATE_LIMIT"},
		{[]string{"--set", "extraEnv[0].name=MCP_ADDR", "--set", "extraEnv[0].value=0.0.0.0:8090"}, "extraEnv MCP_ADDR"},
	} {
		_, stderr, err := helm(t, append([]string{"template", release, chartDir}, tc.set...)...)
		if err == nil {
			t.Errorf("%v rendered", tc.set)
		} else if !strings.Contains(stderr, tc.want) {
			t.Errorf("%v refused without %q:\n%s", tc.set, tc.want, stderr)
		}
	}
	// The callback's port is free for the MCP endpoint while no callback is served.
	objs := decode(t, render(t, append(on, "--set", "ports.mcp=8081")...))
	if got := containerPort(t, theContainer(t, objs.deployments[0]), "mcp"); got != 8081 {
		t.Errorf("ports.mcp=8081: container port mcp %d", got)
	}
}

// TestChartRefusesBadOAuthValues: the OAuth values are checked when rendered,
// and a wrong one fails `helm template` naming it, not a pod at start-up (or,
// worse, a user's first authorization).
func TestChartRefusesBadOAuthValues(t *testing.T) {
	on := []string{"--set", "oauth.redirectURL=https://connectors.example.com/oauth/callback"}
	for _, tc := range []struct {
		set  []string
		want string
	}{
		{[]string{"--set", "oauth.redirectURL=http://connectors.example.com/oauth/callback"}, "/oauth/redirectURL"}, // http off loopback
		{[]string{"--set", "oauth.redirectURL=https://connectors.example.com"}, "/oauth/redirectURL"},               // no path to serve it at
		{[]string{"--set", "oauth.redirectURL=https://connectors.example.com/cb?x=1"}, "/oauth/redirectURL"},
		{[]string{"--set", "oauth.redirectURL=connectors.example.com/oauth/callback"}, "/oauth/redirectURL"},
		{append(on, "--set", "oauth.clientMetadataURL=http://connectors.example.com/client.json"), "/oauth/clientMetadataURL"},
		{append(on, "--set", "oauth.clientMetadataURL=https://connectors.example.com/"), "/oauth/clientMetadataURL"},
		{append(on, "--set", "oauth.returnToAllowed={chat.example.com}"), "/oauth/returnToAllowed/0"},
		{append(on, "--set", "oauth.returnToAllowed={https://chat.example.com/?next=x}"), "/oauth/returnToAllowed/0"},
		{append(on, "--set", "oauth.trustedProxies={10.0.0.0/33}"), "/oauth/trustedProxies/0"},
		{append(on, "--set", "oauth.trustedProxies={ingress-nginx}"), "/oauth/trustedProxies/0"},
		{append(on, "--set", "oauth.trustedProxies={10.0.0.0/8,300.1.1.1}"), "/oauth/trustedProxies/1"},
		{append(on, "--set", "oauth.tls.secretName=Callback_TLS"), "/oauth/tls/secretName"},
		{append(on, "--set", "oauth.ingress.pathType=Regex"), "/oauth/ingress/pathType"},
		{append(on, "--set", "oauth.servecallback=false"), "servecallback"},
		{append(on, "--set", "ports.oauth=70000"), "/ports/oauth"},
		{append(on, "--set", "ports.oauth=9464"), "ports.oauth=9464 is ports.admin too"},
		{append(on, "--set", "config.OAUTH_STATE_TTL=10"), "/config/OAUTH_STATE_TTL"},
		{append(on, "--set", "config.OAUTH_STATE_TTL=48h"), "config.OAUTH_STATE_TTL=48h: at most 24h"},
		{append(on, "--set", "config.OAUTH_STATE_TTL=1441m"), "config.OAUTH_STATE_TTL=1441m: at most 24h"},
		{append(on, "--set", "config.OAUTH_STATE_TTL=0s"), "config.OAUTH_STATE_TTL=0s: want a positive duration"},
		{append(on, "--set", "config.OAUTH_CALLBACK_RATE=0"), "/config/OAUTH_CALLBACK_RATE"},
		{append(on, "--set", "config.OAUTH_CALLBACK_RATE=fast"), "/config/OAUTH_CALLBACK_RATE"},
		{append(on, "--set", "config.OAUTH_CALLBACK_BURST=0"), "/config/OAUTH_CALLBACK_BURST"},
		{[]string{"--set", "oauth.clientMetadataURL=https://connectors.example.com/oauth/client.json"}, "oauth.clientMetadataURL needs oauth.redirectURL"},
		{[]string{"--set", "oauth.tls.secretName=callback-tls"}, "oauth.tls.secretName: the callback listener is off"},
		{append(on, "--set", "oauth.serveCallback=false", "--set", "oauth.ingress.enabled=true"), "oauth.ingress.enabled: the callback listener is off"},
		{append(on, "--set", "oauth.serveCallback=false", "--set", "oauth.clientMetadataURL=https://connectors.example.com/oauth/client.json"), "oauth.clientMetadataURL: the callback listener is off"},
		{[]string{"--set", "oauth.redirectURL=https://203.0.113.7/oauth/callback", "--set", "oauth.ingress.enabled=true"}, "an Ingress routes host names"},
	} {
		_, stderr, err := helm(t, append([]string{"template", release, chartDir}, tc.set...)...)
		if err == nil {
			t.Errorf("%v rendered", tc.set)
		} else if !strings.Contains(stderr, tc.want) {
			t.Errorf("%v refused without %q:\n%s", tc.set, tc.want, stderr)
		}
	}
	// The forms the service accepts render: http on loopback, IPv6 and single
	// addresses, 24h, fractional rates.
	if _, stderr, err := helm(t, "template", release, chartDir, "--set", "oauth.redirectURL=http://localhost:8081/oauth/callback",
		"--set", "oauth.trustedProxies={fd00:10:244::/56,10.0.0.7,10.244.0.0/16}", "--set", "oauth.returnToAllowed={http://localhost:3000,https://chat.example.com/app}",
		"--set", "config.OAUTH_STATE_TTL=24h", "--set", "config.OAUTH_CALLBACK_RATE=0.5", "--set", "config.OAUTH_CALLBACK_BURST=5"); err != nil {
		t.Errorf("good values refused: %v\n%s", err, stderr)
	}
}

// TestChartSettingsPassTheBinarysChecks: what each rendering sets, as a pod
// sees it (the ConfigMap, then env with $(…) expanded, Secrets and the
// downward API filled in), passes connector-svc's own checks of its settings:
// `migrate` with exactly that environment gets as far as dialing Postgres, at
// a port where nothing listens.
func TestChartSettingsPassTheBinarysChecks(t *testing.T) {
	helmBin(t)
	bin, err := buildOnce()
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range renderings {
		t.Run(r.name, func(t *testing.T) {
			cmd := exec.Command(bin, "migrate")
			cmd.Env = podEnv(t, decode(t, render(t, r.args...)))
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("connector-svc migrate succeeded against a port where nothing listens:\n%s", out)
			}
			if !strings.Contains(string(out), "connect to Postgres at 127.0.0.1:1") {
				t.Errorf("connector-svc refused the settings the chart renders, before dialing Postgres:\n%s", out)
			}
		})
	}
}

var dependentVar = regexp.MustCompile(`\$\([A-Za-z_][A-Za-z0-9_]*\)`)

// podEnv is the environment a pod of the rendering gets: the ConfigMap, then
// env with $(…) expanded, Secrets (test values, or canaries) and the downward
// API filled in.
func podEnv(t *testing.T, objs objects) []string {
	t.Helper()
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	secrets := map[string]string{
		"SECRET_KEY":   base64.StdEncoding.EncodeToString(key),
		"DATABASE_URL": "postgres://connector@127.0.0.1:1/connector_svc?sslmode=disable",
	}
	fields := map[string]string{"metadata.name": release + "-connector-svc-7d9f8c6b5-x2x4z", "status.podIP": "10.244.1.7"}
	c := theContainer(t, objs.deployments[0])
	vars := map[string]string{}
	var order []string
	setVar := func(n, v string) {
		if _, ok := vars[n]; !ok {
			order = append(order, n)
		}
		vars[n] = v
	}
	for _, from := range c.EnvFrom {
		cm := findConfigMap(objs.configMaps, from.ConfigMapRef.Name)
		if cm == nil {
			t.Fatalf("envFrom names ConfigMap %s, which the chart does not render", from.ConfigMapRef.Name)
		}
		for _, k := range slices.Sorted(maps.Keys(cm.Data)) {
			setVar(k, cm.Data[k])
		}
	}
	for _, e := range c.Env {
		switch {
		case e.ValueFrom == nil:
			// Kubernetes expands $(NAME) of variables defined before.
			setVar(e.Name, dependentVar.ReplaceAllStringFunc(e.Value, func(m string) string {
				if v, ok := vars[m[2:len(m)-1]]; ok {
					return v
				}
				return m
			}))
		case e.ValueFrom.FieldRef != nil:
			setVar(e.Name, fields[e.ValueFrom.FieldRef.FieldPath])
		case e.ValueFrom.SecretKeyRef != nil:
			v, ok := secrets[e.Name]
			if !ok {
				v = "canary-" + strings.ToLower(e.Name)
			}
			setVar(e.Name, v)
		default:
			t.Fatalf("env %s from %+v: not filled in here", e.Name, e.ValueFrom)
		}
	}
	env := make([]string, 0, len(order))
	for _, n := range order {
		env = append(env, n+"="+vars[n])
	}
	return env
}
