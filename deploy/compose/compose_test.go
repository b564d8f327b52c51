// Package compose_test checks docker-compose.yml's observability profile
// offline (no Docker engine here, and `docker compose config` needs the
// compose plugin): the profile adds Prometheus and Grafana and nothing else,
// Prometheus scrapes /metrics on the admin port the service listens on and
// publishes, and Grafana is provisioned with that Prometheus and the
// repository's dashboard from files that exist. Whether the images start and
// Grafana draws the panels is not tested here.
package compose_test

import (
	"encoding/json"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const (
	root    = "../.."
	profile = "observability"
)

type service struct {
	Image       string            `yaml:"image"`
	Profiles    []string          `yaml:"profiles"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	DependsOn   yaml.Node         `yaml:"depends_on"`
}

type composeFile struct {
	Services map[string]service `yaml:"services"`
	Volumes  map[string]any     `yaml:"volumes"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(b, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

// mount is one "source:target[:ro]" volume of a service.
type mount struct {
	source, target string
	readOnly       bool
}

func mounts(t *testing.T, s service) []mount {
	t.Helper()
	var out []mount
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		if len(parts) < 2 || len(parts) > 3 {
			t.Fatalf("volume %q is not source:target[:mode]", v)
		}
		m := mount{source: parts[0], target: parts[1]}
		m.readOnly = len(parts) == 3 && parts[2] == "ro"
		out = append(out, m)
	}
	return out
}

// hostPath is a bind mount's source in the repository, or "" for a named volume.
func hostPath(m mount) string {
	if !strings.HasPrefix(m.source, "./") {
		return ""
	}
	return filepath.Join(root, filepath.FromSlash(m.source))
}

// fileIn is the repository file a path in the container comes from, through
// the service's bind mounts (of a file or of a directory above it).
func fileIn(t *testing.T, s service, containerPath string) string {
	t.Helper()
	for _, m := range mounts(t, s) {
		h := hostPath(m)
		if h == "" {
			continue
		}
		if containerPath == m.target {
			return h
		}
		if rel, ok := strings.CutPrefix(containerPath, strings.TrimSuffix(m.target, "/")+"/"); ok {
			return filepath.Join(h, filepath.FromSlash(rel))
		}
	}
	t.Fatalf("%s is in no bind mount of %v", containerPath, s.Volumes)
	return ""
}

// published is the host address:port of a container port, from "host:port:container" entries.
func published(t *testing.T, s service, containerPort string) (string, bool) {
	t.Helper()
	for _, p := range s.Ports {
		i := strings.LastIndex(p, ":")
		if i < 0 || p[i+1:] != containerPort {
			continue
		}
		return p[:i], true
	}
	return "", false
}

// TestObservabilityProfile: `docker compose up` still starts Postgres and
// the service alone; the profile adds Prometheus and Grafana, pinned,
// published on the host's loopback only.
func TestObservabilityProfile(t *testing.T) {
	c := readCompose(t)
	var always, inProfile []string
	for name, s := range c.Services {
		switch {
		case len(s.Profiles) == 0:
			always = append(always, name)
		case slices.Equal(s.Profiles, []string{profile}):
			inProfile = append(inProfile, name)
		default:
			t.Errorf("service %s has profiles %v", name, s.Profiles)
		}
	}
	slices.Sort(always)
	slices.Sort(inProfile)
	if !slices.Equal(always, []string{"connector-svc", "postgres"}) {
		t.Errorf("services without a profile %v, want connector-svc and postgres", always)
	}
	if !slices.Equal(inProfile, []string{"grafana", "prometheus"}) {
		t.Errorf("services of profile %s %v, want grafana and prometheus", profile, inProfile)
	}
	pinned := regexp.MustCompile(`^[a-z0-9./-]+:v?\d+\.\d+\.\d+$`)
	for _, name := range inProfile {
		s := c.Services[name]
		if !pinned.MatchString(s.Image) {
			t.Errorf("%s image %q is not pinned to a release", name, s.Image)
		}
		if len(s.Ports) == 0 {
			t.Errorf("%s publishes no port", name)
		}
		for _, m := range mounts(t, s) {
			if h := hostPath(m); h != "" {
				if _, err := os.Stat(h); err != nil {
					t.Errorf("%s mounts %s, which does not exist: %v", name, m.source, err)
				}
				if !m.readOnly {
					t.Errorf("%s mounts %s writable; the repository's files are read-only there", name, m.source)
				}
			} else if _, ok := c.Volumes[m.source]; !ok {
				t.Errorf("%s mounts volume %s, which docker-compose.yml does not declare", name, m.source)
			}
		}
	}
	for name, s := range c.Services {
		for _, p := range s.Ports {
			if !strings.HasPrefix(p, "127.0.0.1:") {
				t.Errorf("%s publishes %q beyond the host's loopback", name, p)
			}
		}
	}
}

// adminPort is the service's admin listener port: ADMIN_ADDR on every
// interface of the container (with ADMIN_ANY_ADDRESS, or the service refuses
// it), published on the host's loopback.
func adminPort(t *testing.T, c composeFile) string {
	t.Helper()
	s := c.Services["connector-svc"]
	host, port, err := net.SplitHostPort(s.Environment["ADMIN_ADDR"])
	if err != nil || (host != "0.0.0.0" && host != "") {
		t.Fatalf("connector-svc ADMIN_ADDR=%q, want 0.0.0.0:<port>, reachable from Prometheus's container (%v)", s.Environment["ADMIN_ADDR"], err)
	}
	if s.Environment["ADMIN_ANY_ADDRESS"] != "true" {
		t.Errorf("ADMIN_ANY_ADDRESS=%q: the service refuses ADMIN_ADDR off loopback without it", s.Environment["ADMIN_ANY_ADDRESS"])
	}
	if hp, ok := published(t, s, port); !ok || hp != "127.0.0.1:"+port {
		t.Errorf("connector-svc publishes the admin port %s as %q, want 127.0.0.1:%s", port, hp, port)
	}
	return port
}

// TestPrometheusScrapesTheAdminPort: the configuration Prometheus is started
// with is the repository's file, and it scrapes /metrics on connector-svc's
// admin port over the compose network.
func TestPrometheusScrapesTheAdminPort(t *testing.T) {
	c := readCompose(t)
	port := adminPort(t, c)
	p := c.Services["prometheus"]
	var configFile string
	for _, a := range p.Command {
		if v, ok := strings.CutPrefix(a, "--config.file="); ok {
			configFile = v
		}
	}
	if configFile == "" {
		t.Fatalf("prometheus command %v sets no --config.file", p.Command)
	}
	b, err := os.ReadFile(fileIn(t, p, configFile))
	if err != nil {
		t.Fatal(err)
	}
	var cfg struct {
		ScrapeConfigs []struct {
			JobName       string `yaml:"job_name"`
			MetricsPath   string `yaml:"metrics_path"`
			Scheme        string `yaml:"scheme"`
			StaticConfigs []struct {
				Targets []string `yaml:"targets"`
			} `yaml:"static_configs"`
		} `yaml:"scrape_configs"`
	}
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(false)
	if err := dec.Decode(&cfg); err != nil {
		t.Fatalf("%s: %v", configFile, err)
	}
	want := "connector-svc:" + port
	found := false
	for _, sc := range cfg.ScrapeConfigs {
		for _, st := range sc.StaticConfigs {
			if slices.Contains(st.Targets, want) {
				found = true
				if (sc.MetricsPath != "" && sc.MetricsPath != "/metrics") || (sc.Scheme != "" && sc.Scheme != "http") {
					t.Errorf("job %s scrapes %s%s over %q, want /metrics over http", sc.JobName, want, sc.MetricsPath, sc.Scheme)
				}
			}
		}
	}
	if !found {
		t.Errorf("no scrape job targets %s:\n%s", want, b)
	}
	if !dependsOn(t, p, "connector-svc") {
		t.Error("prometheus does not depend on connector-svc")
	}
}

func dependsOn(t *testing.T, s service, name string) bool {
	t.Helper()
	switch s.DependsOn.Kind {
	case yaml.SequenceNode:
		var l []string
		if err := s.DependsOn.Decode(&l); err != nil {
			t.Fatal(err)
		}
		return slices.Contains(l, name)
	case yaml.MappingNode:
		var m map[string]any
		if err := s.DependsOn.Decode(&m); err != nil {
			t.Fatal(err)
		}
		_, ok := m[name]
		return ok
	}
	return false
}

// TestGrafanaIsProvisioned: Grafana reads its provisioning from the
// repository: a Prometheus data source at the profile's Prometheus, and a
// dashboards provider whose path is a mount of deploy/grafana, which holds
// the dashboard the chart ships; the dashboard's data source variable is of
// that data source's type, and the home dashboard is that file.
func TestGrafanaIsProvisioned(t *testing.T) {
	c := readCompose(t)
	g := c.Services["grafana"]
	provisioning := fileIn(t, g, "/etc/grafana/provisioning")

	// Data sources.
	dsFiles, _ := filepath.Glob(filepath.Join(provisioning, "datasources", "*.y*ml"))
	if len(dsFiles) == 0 {
		t.Fatalf("no data source files under %s/datasources", provisioning)
	}
	type datasource struct {
		Name      string `yaml:"name"`
		Type      string `yaml:"type"`
		URL       string `yaml:"url"`
		IsDefault bool   `yaml:"isDefault"`
	}
	var sources []datasource
	for _, f := range dsFiles {
		var file struct {
			APIVersion  int          `yaml:"apiVersion"`
			Datasources []datasource `yaml:"datasources"`
		}
		readYAML(t, f, &file)
		if file.APIVersion != 1 {
			t.Errorf("%s: apiVersion %d, want 1", f, file.APIVersion)
		}
		sources = append(sources, file.Datasources...)
	}
	promPort := "9090"
	if hp, ok := published(t, c.Services["prometheus"], promPort); !ok {
		t.Errorf("prometheus does not publish its port %s (%q)", promPort, hp)
	}
	i := slices.IndexFunc(sources, func(d datasource) bool { return d.Type == "prometheus" })
	if i < 0 {
		t.Fatalf("no prometheus data source in %v", sources)
	}
	ds := sources[i]
	u, err := url.Parse(ds.URL)
	if err != nil || u.Host != "prometheus:"+promPort {
		t.Errorf("data source %s at %q, want http://prometheus:%s, the profile's Prometheus (%v)", ds.Name, ds.URL, promPort, err)
	}
	if !ds.IsDefault {
		t.Errorf("data source %s is not the default: the dashboard's datasource variable starts at the default", ds.Name)
	}

	// Dashboards.
	dbFiles, _ := filepath.Glob(filepath.Join(provisioning, "dashboards", "*.y*ml"))
	if len(dbFiles) == 0 {
		t.Fatalf("no dashboard provider files under %s/dashboards", provisioning)
	}
	var dashboards []string
	for _, f := range dbFiles {
		var file struct {
			APIVersion int `yaml:"apiVersion"`
			Providers  []struct {
				Type    string `yaml:"type"`
				Options struct {
					Path string `yaml:"path"`
				} `yaml:"options"`
			} `yaml:"providers"`
		}
		readYAML(t, f, &file)
		for _, p := range file.Providers {
			if p.Type != "file" {
				t.Errorf("%s: provider of type %q", f, p.Type)
				continue
			}
			dir := fileIn(t, g, p.Options.Path)
			found, _ := filepath.Glob(filepath.Join(dir, "*.json"))
			dashboards = append(dashboards, found...)
		}
	}
	shipped, err := filepath.Abs(filepath.Join(root, "deploy", "grafana", "connector-svc.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !slices.ContainsFunc(dashboards, func(d string) bool { a, _ := filepath.Abs(d); return a == shipped }) {
		t.Errorf("the providers load %v, not deploy/grafana/connector-svc.json", dashboards)
	}
	raw, err := os.ReadFile(shipped)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name  string `json:"name"`
				Type  string `json:"type"`
				Query string `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(raw, &dash); err != nil {
		t.Fatalf("deploy/grafana/connector-svc.json: %v", err)
	}
	if !slices.ContainsFunc(dash.Templating.List, func(v struct {
		Name  string `json:"name"`
		Type  string `json:"type"`
		Query string `json:"query"`
	}) bool {
		return v.Type == "datasource" && v.Query == ds.Type
	}) {
		t.Errorf("the dashboard has no datasource variable of type %s: %+v", ds.Type, dash.Templating.List)
	}
	if home := g.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]; home != "" {
		if a, _ := filepath.Abs(fileIn(t, g, home)); a != shipped {
			t.Errorf("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH=%s is %s, not the shipped dashboard", home, a)
		}
	}
	if g.Environment["GF_AUTH_ANONYMOUS_ENABLED"] == "true" && g.Environment["GF_AUTH_ANONYMOUS_ORG_ROLE"] != "Viewer" {
		t.Errorf("anonymous visitors are Grafana %ss, want Viewers", g.Environment["GF_AUTH_ANONYMOUS_ORG_ROLE"])
	}
	if !dependsOn(t, g, "prometheus") {
		t.Error("grafana does not depend on prometheus")
	}
}

func readYAML(t *testing.T, file string, v any) {
	t.Helper()
	b, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatalf("%s: %v", file, err)
	}
}
