package main

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"
)

// want is what the image must be.
type want struct {
	version, revision, source string
	localBase                 bool // scripts/image.sh's base: its files, and no executable but the binary
	runBinary                 bool // run the binary's `version` where the platform allows
}

// config is the part of the image config (OCI image spec, docker's alike)
// checked here.
type config struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
	Config       struct {
		User       string            `json:"User"`
		Entrypoint []string          `json:"Entrypoint"`
		Cmd        []string          `json:"Cmd"`
		Env        []string          `json:"Env"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

// file is one regular file or directory of the image's filesystem.
type file struct {
	mode     fs.FileMode
	uid      int
	size     int64
	contents []byte // for the few files read: /etc/passwd, the CA bundle; the binary only when it is run
}

// report is what a passing check found, for the log.
type report struct {
	ref, user, entrypoint string
	layers                int
	binarySize            int64
	ranVersion            string
}

func (r report) String() string {
	s := fmt.Sprintf("%s, user %s, entrypoint %s (%.1f MiB), %d layers", r.ref, r.user, r.entrypoint, float64(r.binarySize)/(1<<20), r.layers)
	if r.ranVersion != "" {
		s += fmt.Sprintf("; it prints %q", r.ranVersion)
	}
	return s
}

// keep are the files whose contents the check reads.
var keep = []string{"etc/passwd", "etc/ssl/certs/ca-certificates.crt"}

// check reads the tarball and returns what it found, or the first thing the
// image gets wrong.
func check(tarball string, w want) (report, error) {
	var r report
	blobs, err := readOuter(tarball)
	if err != nil {
		return r, err
	}
	var manifest []struct {
		Config   string   `json:"Config"`
		RepoTags []string `json:"RepoTags"`
		Layers   []string `json:"Layers"`
	}
	if err := json.Unmarshal(blobs["manifest.json"], &manifest); err != nil {
		return r, fmt.Errorf("manifest.json: %v", err)
	}
	if len(manifest) != 1 {
		return r, fmt.Errorf("manifest.json lists %d images, want 1", len(manifest))
	}
	m := manifest[0]
	if len(m.RepoTags) == 0 {
		return r, errors.New("manifest.json: the image has no repository:tag (docker load would leave it unnamed)")
	}
	r.ref, r.layers = m.RepoTags[0], len(m.Layers)
	var cfg config
	if err := json.Unmarshal(blobs[m.Config], &cfg); err != nil {
		return r, fmt.Errorf("config %s: %v", m.Config, err)
	}

	if err := checkLabels(cfg.Config.Labels, w); err != nil {
		return r, err
	}

	// The user: named by number (runAsNonRoot can check only a number), not root.
	uid, err := nonRootUID(cfg.Config.User)
	if err != nil {
		return r, err
	}
	r.user = cfg.Config.User

	if r.entrypoint, err = checkEntrypoint(cfg); err != nil {
		return r, err
	}

	// The filesystem, layer over layer.
	files := map[string]file{}
	binaryName := strings.TrimPrefix(r.entrypoint, "/")
	for _, l := range m.Layers {
		b, ok := blobs[l]
		if !ok {
			return r, fmt.Errorf("layer %s is not in the tarball", l)
		}
		if err := readLayer(b, files, append(slices.Clone(keep), binaryName), w.runBinary); err != nil {
			return r, fmt.Errorf("layer %s: %v", l, err)
		}
	}
	bin, ok := files[binaryName]
	if !ok || !bin.mode.IsRegular() {
		return r, fmt.Errorf("the entrypoint %s is not a file in the image's layers", r.entrypoint)
	}
	if bin.mode.Perm()&0o001 == 0 {
		return r, fmt.Errorf("the entrypoint %s is %v: not executable by every user (the chart runs it as another uid)", r.entrypoint, bin.mode)
	}
	r.binarySize = bin.size

	if w.localBase {
		if err := checkLocalBase(files, uid, binaryName); err != nil {
			return r, err
		}
	}

	if w.runBinary && cfg.OS == runtime.GOOS && cfg.Architecture == runtime.GOARCH {
		out, err := runVersion(bin.contents)
		if err != nil {
			return r, err
		}
		if !strings.HasPrefix(out, "connector-svc "+w.version+" (revision "+w.revision) {
			return r, fmt.Errorf("the binary's version prints %q, want connector-svc %s (revision %s …", out, w.version, w.revision)
		}
		r.ranVersion = out
	}
	return r, nil
}

// checkLabels checks the image's OCI labels against what was built.
func checkLabels(labels map[string]string, w want) error {
	for name, v := range map[string]string{"source": w.source, "version": w.version, "revision": w.revision,
		"title": "connector-svc", "licenses": "Apache-2.0"} {
		if got := labels["org.opencontainers.image."+name]; got != v {
			return fmt.Errorf("label org.opencontainers.image.%s is %q, want %q", name, got, v)
		}
	}
	if _, err := time.Parse(time.RFC3339, labels["org.opencontainers.image.created"]); err != nil {
		return fmt.Errorf("label org.opencontainers.image.created: %v", err)
	}
	return nil
}

// checkEntrypoint checks that the entrypoint is the binary alone, by its
// absolute path, with no cmd, and on PATH; it returns the binary's path.
func checkEntrypoint(cfg config) (string, error) {
	ep := cfg.Config.Entrypoint
	if len(ep) != 1 || !path.IsAbs(ep[0]) || path.Base(ep[0]) != "connector-svc" {
		return "", fmt.Errorf("entrypoint %q, want the connector-svc binary by its absolute path alone", ep)
	}
	if len(cfg.Config.Cmd) != 0 {
		return "", fmt.Errorf("cmd %q: the binary's default (serve) needs no arguments; a cmd would be passed to every subcommand run with docker run", cfg.Config.Cmd)
	}
	pathVar := ""
	for _, e := range cfg.Config.Env {
		if v, ok := strings.CutPrefix(e, "PATH="); ok {
			pathVar = v
		}
	}
	if !slices.Contains(filepath.SplitList(pathVar), path.Dir(ep[0])) {
		return "", fmt.Errorf("PATH=%q lacks %s: `kubectl exec … -- connector-svc keys create` would not find the binary", pathVar, path.Dir(ep[0]))
	}
	return ep[0], nil
}

// nonRootUID is the user's uid: a number other than 0 (user or user:group).
func nonRootUID(user string) (int, error) {
	u, _, _ := strings.Cut(user, ":")
	uid, err := strconv.Atoi(u)
	if err != nil {
		return 0, fmt.Errorf("user %q: want a numeric uid (Kubernetes' runAsNonRoot cannot check a name)", user)
	}
	if uid == 0 {
		return 0, fmt.Errorf("user %q is root", user)
	}
	return uid, nil
}

// checkLocalBase: the files scripts/image.sh's base promises, and nothing to
// run but the binary (no shell, no package manager).
func checkLocalBase(files map[string]file, uid int, binaryName string) error {
	passwd, ok := files["etc/passwd"]
	if !ok {
		return errors.New("no /etc/passwd")
	}
	found := false
	sc := bufio.NewScanner(bytes.NewReader(passwd.contents))
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) == 7 && f[2] == strconv.Itoa(uid) {
			found = true
			if home, ok := files[strings.TrimPrefix(f[5], "/")]; !ok || !home.mode.IsDir() || home.uid != uid {
				return fmt.Errorf("the user's home %s is not a directory the user owns", f[5])
			}
		}
	}
	if !found {
		return fmt.Errorf("/etc/passwd has no user %d", uid)
	}
	certs := files["etc/ssl/certs/ca-certificates.crt"]
	if n := bytes.Count(certs.contents, []byte("-----BEGIN CERTIFICATE-----")); n < 10 {
		return fmt.Errorf("/etc/ssl/certs/ca-certificates.crt holds %d certificates: HTTPS to MCP servers and models would fail", n)
	}
	if tmp, ok := files["tmp"]; !ok || !tmp.mode.IsDir() || tmp.mode&fs.ModeSticky == 0 || tmp.mode.Perm() != 0o777 {
		return fmt.Errorf("/tmp is %v, want a directory with mode 1777", files["tmp"].mode)
	}
	for name, f := range files {
		if name != binaryName && f.mode.IsRegular() && f.mode.Perm()&0o111 != 0 {
			return fmt.Errorf("/%s is executable: the base should have nothing to run but the binary", name)
		}
	}
	return nil
}

// readOuter reads every entry of the tarball into memory (an image of tens of
// MiB).
func readOuter(name string) (map[string][]byte, error) {
	f, err := os.Open(name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	blobs := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			return nil, err
		}
		blobs[path.Clean(h.Name)] = b
	}
	if _, ok := blobs["manifest.json"]; !ok {
		return nil, errors.New("no manifest.json: not an image tarball (ko build --tarball, docker save)")
	}
	return blobs, nil
}

// readLayer applies one layer to files: entries added or replaced, whiteouts
// removed; the contents of the names in read are kept (the binary's only
// when withBinary).
func readLayer(b []byte, files map[string]file, read []string, withBinary bool) error {
	var r io.Reader = bytes.NewReader(b)
	if len(b) > 2 && b[0] == 0x1f && b[1] == 0x8b {
		gz, err := gzip.NewReader(r)
		if err != nil {
			return err
		}
		r = gz
	}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return err
		}
		name := strings.TrimPrefix(path.Clean("/"+h.Name), "/")
		dir, base := path.Split(name)
		if wh, ok := strings.CutPrefix(base, ".wh."); ok {
			delete(files, path.Join(dir, wh))
			continue
		}
		f := file{mode: h.FileInfo().Mode(), uid: h.Uid, size: h.Size}
		if slices.Contains(read, name) && (withBinary || slices.Contains(keep, name)) {
			if f.contents, err = io.ReadAll(tr); err != nil {
				return err
			}
		}
		files[name] = f
	}
}

// runVersion writes the binary out and runs its version subcommand.
func runVersion(binary []byte) (string, error) {
	dir, err := os.MkdirTemp("", "image-check")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	bin := filepath.Join(dir, "connector-svc")
	if err := os.WriteFile(bin, binary, 0o755); err != nil {
		return "", err
	}
	cmd := exec.Command(bin, "version")
	cmd.Env = []string{"PATH=/usr/bin:/bin"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("the binary's version: %v\n%s", err, out)
	}
	return strings.TrimSpace(string(out)), nil
}
