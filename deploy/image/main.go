// Command image checks connector-svc's image tarball offline (scripts/image.sh
// runs it after ko builds the image; no Docker engine or registry is needed):
// its OCI labels name the source, version and revision it was built from, it
// runs as a user other than root, its entrypoint is the connector-svc binary
// (in a layer, executable, on PATH, and it prints the version it was stamped
// with), and, on the base scripts/image.sh makes, the base's files are there
// and the binary is the only executable.
//
//	go run ./deploy/image -tarball .dev/image/connector-svc.tar -version V -revision R -source URL
//
// The tarball is what ko --tarball and docker save write: manifest.json, the
// config blob and the layers (gzip or plain tar).
package main

import (
	"flag"
	"fmt"
	"os"
)

func main() {
	var w want
	tarball := flag.String("tarball", ".dev/image/connector-svc.tar", "the image tarball (ko build --tarball, docker save)")
	flag.StringVar(&w.version, "version", "", "the version the image must be labelled and stamped with")
	flag.StringVar(&w.revision, "revision", "", "the VCS revision the image must be labelled with")
	flag.StringVar(&w.source, "source", "", "the source repository URL the image must be labelled with")
	flag.BoolVar(&w.localBase, "local-base", true, "the image is on scripts/image.sh's own base: check its files, and that the binary is the only executable")
	flag.BoolVar(&w.runBinary, "run", true, "run the entrypoint's `version` when the image's platform is this machine's")
	flag.Parse()
	if w.version == "" || w.revision == "" || w.source == "" {
		fmt.Fprintln(os.Stderr, "image: -version, -revision and -source are required")
		os.Exit(2)
	}
	r, err := check(*tarball, w)
	if err != nil {
		fmt.Fprintf(os.Stderr, "image %s: %v\n", *tarball, err)
		os.Exit(1)
	}
	fmt.Printf("image %s: ok: %s\n", *tarball, r)
}
