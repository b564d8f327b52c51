package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// entry is one file of a synthetic layer.
type entry struct {
	name string
	mode int64
	uid  int
	dir  bool
	body string
}

func layer(t *testing.T, entries []entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	gz := gzip.NewWriter(&buf)
	tw := tar.NewWriter(gz)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Size: int64(len(e.body)), Typeflag: tar.TypeReg}
		if e.dir {
			h.Typeflag, h.Size = tar.TypeDir, 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := gz.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// image is a synthetic image as ko lays it out: a base layer, and the binary
// in /ko-app on PATH.
type image struct {
	cfg    map[string]any
	base   []entry
	app    []entry
	noTags bool
}

func goodImage() image {
	certs := strings.Repeat("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n", 12)
	return image{
		cfg: map[string]any{
			"architecture": "amd64", "os": "linux",
			"config": map[string]any{
				"User":       "65532:65532",
				"Entrypoint": []string{"/ko-app/connector-svc"},
				"Env":        []string{"PATH=/usr/local/bin:/usr/bin:/bin:/ko-app", "KO_DATA_PATH=/var/run/ko"},
				"Labels": map[string]string{
					"org.opencontainers.image.source":   "https://github.com/connector-svc/connector-svc",
					"org.opencontainers.image.version":  "v1.2.3",
					"org.opencontainers.image.revision": "feedface",
					"org.opencontainers.image.title":    "connector-svc",
					"org.opencontainers.image.licenses": "Apache-2.0",
					"org.opencontainers.image.created":  "2026-11-28T08:00:00Z",
				},
			},
		},
		base: []entry{
			{name: "etc/", mode: 0o755, dir: true},
			{name: "etc/passwd", mode: 0o644, body: "root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n"},
			{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, body: certs},
			{name: "tmp/", mode: 0o1777, dir: true},
			{name: "home/nonroot/", mode: 0o700, uid: 65532, dir: true},
		},
		app: []entry{{name: "ko-app/connector-svc", mode: 0o755, body: "not a real binary"}},
	}
}

func (im image) write(t *testing.T) string {
	t.Helper()
	cfg, err := json.Marshal(im.cfg)
	if err != nil {
		t.Fatal(err)
	}
	tags := []string{"connector-svc:1.2.3"}
	if im.noTags {
		tags = nil
	}
	manifest, _ := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": tags, "Layers": []string{"base.tar.gz", "app.tar.gz"}}})
	name := filepath.Join(t.TempDir(), "image.tar")
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	tw := tar.NewWriter(f)
	for _, b := range []struct {
		name string
		data []byte
	}{{"manifest.json", manifest}, {"config.json", cfg}, {"base.tar.gz", layer(t, im.base)}, {"app.tar.gz", layer(t, im.app)}} {
		if err := tw.WriteHeader(&tar.Header{Name: b.name, Mode: 0o644, Size: int64(len(b.data))}); err != nil {
			t.Fatal(err)
		}
		tw.Write(b.data)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	return name
}

var wantGood = want{version: "v1.2.3", revision: "feedface", source: "https://github.com/connector-svc/connector-svc", localBase: true}

func TestCheckPassesAGoodImage(t *testing.T) {
	r, err := check(goodImage().write(t), wantGood)
	if err != nil {
		t.Fatal(err)
	}
	if r.user != "65532:65532" || r.entrypoint != "/ko-app/connector-svc" || r.layers != 2 {
		t.Errorf("report %+v", r)
	}
}

// TestCheckRefuses: each thing the check promises fails it when it is wrong.
func TestCheckRefuses(t *testing.T) {
	cfgOf := func(im image) map[string]any { return im.cfg["config"].(map[string]any) }
	for _, tc := range []struct {
		name   string
		change func(*image, *want)
		errSub string
	}{
		{"root user", func(im *image, _ *want) { cfgOf(*im)["User"] = "0:0" }, "is root"},
		{"no user", func(im *image, _ *want) { cfgOf(*im)["User"] = "" }, "numeric uid"},
		{"named user", func(im *image, _ *want) { cfgOf(*im)["User"] = "nonroot" }, "numeric uid"},
		{"wrong revision", func(im *image, _ *want) {
			cfgOf(*im)["Labels"].(map[string]string)["org.opencontainers.image.revision"] = "cafe"
		}, "image.revision"},
		{"no source label", func(im *image, _ *want) {
			delete(cfgOf(*im)["Labels"].(map[string]string), "org.opencontainers.image.source")
		}, "image.source"},
		{"other version wanted", func(_ *image, w *want) { w.version = "v9" }, "image.version"},
		{"bad created", func(im *image, _ *want) {
			cfgOf(*im)["Labels"].(map[string]string)["org.opencontainers.image.created"] = "unknown"
		}, "image.created"},
		{"shell entrypoint", func(im *image, _ *want) { cfgOf(*im)["Entrypoint"] = []string{"/bin/sh", "-c", "connector-svc"} }, "entrypoint"},
		{"a cmd", func(im *image, _ *want) { cfgOf(*im)["Cmd"] = []string{"serve"} }, "cmd"},
		{"binary off PATH", func(im *image, _ *want) { cfgOf(*im)["Env"] = []string{"PATH=/usr/bin:/bin"} }, "PATH"},
		{"binary missing", func(im *image, _ *want) { im.app = nil }, "not a file"},
		{"binary whited out", func(im *image, _ *want) {
			im.app = append(im.app, entry{name: "ko-app/.wh.connector-svc", mode: 0o644})
		}, "not a file"},
		{"binary not executable by others", func(im *image, _ *want) { im.app[0].mode = 0o750 }, "not executable"},
		{"no passwd entry", func(im *image, _ *want) { im.base[1].body = "root:x:0:0:root:/root:/sbin/nologin\n" }, "no user 65532"},
		{"home owned by root", func(im *image, _ *want) { im.base[4].uid = 0 }, "home"},
		{"no CA bundle", func(im *image, _ *want) { im.base[2].body = "" }, "certificates"},
		{"tmp not sticky", func(im *image, _ *want) { im.base[3].mode = 0o777 }, "/tmp"},
		{"a shell", func(im *image, _ *want) { im.base = append(im.base, entry{name: "bin/sh", mode: 0o755, body: "x"}) }, "/bin/sh is executable"},
		{"no tag", func(im *image, _ *want) { im.noTags = true }, "repository:tag"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			im, w := goodImage(), wantGood
			tc.change(&im, &w)
			_, err := check(im.write(t), w)
			if err == nil || !strings.Contains(err.Error(), tc.errSub) {
				t.Errorf("check: %v; want an error with %q", err, tc.errSub)
			}
		})
	}
	// A base pulled from a registry (IMAGE_BASE) is not checked for the local base's files.
	im := goodImage()
	im.base = append(im.base, entry{name: "bin/sh", mode: 0o755, body: "x"})
	w := wantGood
	w.localBase = false
	if _, err := check(im.write(t), w); err != nil {
		t.Errorf("another base: %v", err)
	}
}

func TestCheckRefusesWhatIsNoImage(t *testing.T) {
	name := filepath.Join(t.TempDir(), "x.tar")
	os.WriteFile(name, layer(t, []entry{{name: "a", mode: 0o644, body: "x"}}), 0o644)
	if _, err := check(name, wantGood); err == nil {
		t.Error("a tarball that is no image passed")
	}
}
