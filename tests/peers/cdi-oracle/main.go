// cdi-oracle: the CNCF CDI reference library (tags.cncf.io/container-device-interface) as a
// differential oracle for actk (issue 25). A test peer only: actk never links Go code.
//
// Commands:
//
//	cdi-oracle batch < REQUEST.json > RESULT.json
//	    REQUEST: {"specs": ["FILE", ...], "injections": [{"id": "ID", "specDir": "DIR", "config": "FILE"}]}
//	    For each spec file: the reference's verdict (cdi.ReadSpec: YAML/JSON decoding with
//	    known fields only, then every device and edit validated, as engines load spec
//	    directories), and the kind and device names read leniently (so names of a refused spec
//	    can still be requested). For each injection: the OCI config.json FILE decoded as
//	    runtime-spec's Spec, the devices named by its cdi.k8s.io/* annotations
//	    (cdi.ParseAnnotations, as containerd and CRI-O take them), injected by a cache over DIR
//	    (cdi.NewCache without auto-refresh; Cache.InjectDevices), and the resulting config.
//	cdi-oracle inject SPEC_DIR CONFIG NAME...
//	    Injects the named devices into the OCI config.json CONFIG in place, with a cache over
//	    SPEC_DIR, as a CDI-aware engine does before it calls runc: the baseline of the
//	    conformance suites' request passes (tests/conformance).
//	cdi-oracle extract SRC_DIR OUT_DIR
//	    Writes every string literal of SRC_DIR/*_test.go that looks like a CDI spec (names
//	    cdiVersion, kind or devices) to OUT_DIR/<file>-<line>.yaml: the reference's own test
//	    specs, kept verbatim (valid and invalid alike).
package main

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"go.yaml.in/yaml/v3"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type request struct {
	Specs      []string    `json:"specs"`
	Injections []injection `json:"injections"`
}

type injection struct {
	ID      string `json:"id"`
	SpecDir string `json:"specDir"`
	Config  string `json:"config"`
}

type specResult struct {
	Path  string   `json:"path"`
	Valid bool     `json:"valid"`
	Error string   `json:"error,omitempty"`
	Kind  string   `json:"kind,omitempty"`
	Names []string `json:"names"`
}

type injectionResult struct {
	ID         string          `json:"id"`
	OK         bool            `json:"ok"`
	Error      string          `json:"error,omitempty"`
	Unresolved []string        `json:"unresolved,omitempty"`
	Config     json.RawMessage `json:"config,omitempty"`
}

type result struct {
	Specs      []specResult      `json:"specs"`
	Injections []injectionResult `json:"injections"`
}

// lenient is what is read from a spec the reference may refuse: enough to name its devices.
type lenient struct {
	Kind    string `yaml:"kind"`
	Devices []struct {
		Name string `yaml:"name"`
	} `yaml:"devices"`
}

func names(path string) (string, []string) {
	data, err := os.ReadFile(path)
	if err != nil {
		return "", nil
	}
	var l lenient
	if yaml.Unmarshal(data, &l) != nil {
		return "", nil
	}
	out := []string{}
	for _, d := range l.Devices {
		if d.Name != "" && l.Kind != "" {
			out = append(out, l.Kind+"="+d.Name)
		}
	}
	return l.Kind, out
}

func batch() error {
	var req request
	if err := json.NewDecoder(os.Stdin).Decode(&req); err != nil {
		return fmt.Errorf("reading the request on stdin: %w", err)
	}
	res := result{Specs: []specResult{}, Injections: []injectionResult{}}
	for _, p := range req.Specs {
		r := specResult{Path: p}
		r.Kind, r.Names = names(p)
		if _, err := cdi.ReadSpec(p, 0); err != nil {
			r.Error = err.Error()
		} else {
			r.Valid = true
		}
		res.Specs = append(res.Specs, r)
	}
	caches := map[string]*cdi.Cache{}
	for _, in := range req.Injections {
		r := injectionResult{ID: in.ID}
		res.Injections = append(res.Injections, inject(in, caches, r))
	}
	enc := json.NewEncoder(os.Stdout)
	return enc.Encode(res)
}

func inject(in injection, caches map[string]*cdi.Cache, r injectionResult) injectionResult {
	data, err := os.ReadFile(in.Config)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	var spec oci.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		r.Error = "config.json: " + err.Error()
		return r
	}
	_, devices, err := cdi.ParseAnnotations(spec.Annotations)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	sort.Strings(devices) // map order; the harness writes one annotation, so this is its order
	cache, ok := caches[in.SpecDir]
	if !ok {
		cache, err = cdi.NewCache(cdi.WithSpecDirs(in.SpecDir), cdi.WithAutoRefresh(false))
		if err != nil && cache == nil {
			r.Error = err.Error()
			return r
		}
		caches[in.SpecDir] = cache
	}
	unresolved, err := cache.InjectDevices(&spec, devices...)
	if err != nil {
		r.Error = err.Error()
		r.Unresolved = unresolved
		return r
	}
	out, err := json.Marshal(&spec)
	if err != nil {
		r.Error = err.Error()
		return r
	}
	r.OK = true
	r.Config = out
	return r
}

func injectFile(specDir, config string, devices []string) error {
	data, err := os.ReadFile(config)
	if err != nil {
		return err
	}
	var spec oci.Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("%s: %w", config, err)
	}
	cache, err := cdi.NewCache(cdi.WithSpecDirs(specDir), cdi.WithAutoRefresh(false))
	if err != nil && cache == nil {
		return err
	}
	if _, err := cache.InjectDevices(&spec, devices...); err != nil {
		return err
	}
	out, err := json.Marshal(&spec)
	if err != nil {
		return err
	}
	return os.WriteFile(config, out, 0o644)
}

func extract(src, out string) error {
	files, err := filepath.Glob(filepath.Join(src, "*_test.go"))
	if err != nil {
		return err
	}
	if err := os.MkdirAll(out, 0o755); err != nil {
		return err
	}
	seen := map[[32]byte]bool{}
	n := 0
	for _, f := range files {
		fset := token.NewFileSet()
		file, err := parser.ParseFile(fset, f, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(file, func(node ast.Node) bool {
			lit, ok := node.(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			s, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			if !strings.Contains(s, "cdiVersion") && !strings.Contains(s, "kind:") && !strings.Contains(s, "devices:") {
				return true
			}
			// A format string (fmt.Sprintf template) is not a spec by itself.
			if strings.Contains(s, "%s") || strings.Contains(s, "%d") || strings.Contains(s, "%v") || strings.Contains(s, "%q") {
				return true
			}
			h := sha256.Sum256([]byte(s))
			if seen[h] {
				return true
			}
			seen[h] = true
			name := fmt.Sprintf("%s-%d.yaml", strings.TrimSuffix(filepath.Base(f), ".go"), fset.Position(lit.Pos()).Line)
			if err := os.WriteFile(filepath.Join(out, name), []byte(s), 0o644); err == nil {
				n++
			}
			return true
		})
	}
	fmt.Fprintf(os.Stderr, "cdi-oracle: %d test specs extracted from %s\n", n, src)
	return nil
}

func main() {
	var err error
	switch {
	case len(os.Args) == 2 && os.Args[1] == "batch":
		err = batch()
	case len(os.Args) >= 5 && os.Args[1] == "inject":
		err = injectFile(os.Args[2], os.Args[3], os.Args[4:])
	case len(os.Args) == 4 && os.Args[1] == "extract":
		err = extract(os.Args[2], os.Args[3])
	default:
		err = fmt.Errorf("usage: cdi-oracle batch < request.json | cdi-oracle inject SPEC_DIR CONFIG NAME... | cdi-oracle extract SRC_DIR OUT_DIR")
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "cdi-oracle:", err)
		os.Exit(1)
	}
}
