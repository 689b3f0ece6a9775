package main

import (
	"encoding/json"
	"strings"
	"testing"
)

// quote writes what json.dumps writes for the text Python decodes from the same bytes
// (UTF-8 with surrogateescape); the expected strings are Python's own output
// (json.dumps(os.fsdecode(b))).
func TestQuoteWritesWhatPythonsJsonDumpsWritesForTheSameBytes(t *testing.T) {
	cases := map[string]string{
		"":                         `""`,
		"plain /path=value":        `"plain /path=value"`,
		"quote\" back\\ slash/":    `"quote\" back\\ slash/"`,
		"\n\r\t\b\f\x01\x1f\x7f":   `"\n\r\t\b\f\u0001\u001f\u007f"`,
		"caf\xc3\xa9 \xe2\x9c\x93": `"caf\u00e9 \u2713"`,
		"\xf0\x9f\x98\x80":         `"\ud83d\ude00"`,
		"bad \xff\xfe end":         `"bad \udcff\udcfe end"`,
		"cut \xe2\x82A":            `"cut \udce2\udc82A"`,
		"surrogate \xed\xa0\x80":   `"surrogate \udced\udca0\udc80"`,
		"overlong \xc0\xaf":        `"overlong \udcc0\udcaf"`,
	}
	for in, want := range cases {
		var b strings.Builder
		quote(&b, in)
		if b.String() != want {
			t.Errorf("quote(%q) = %s, want %s", in, b.String(), want)
		}
	}
}

// The request is one JSON object of the fields the loader checks (server._check).
func TestTheRequestIsTheJsonTheLoaderReads(t *testing.T) {
	t.Setenv("LAUNCHER_TEST", "a \"b\" \xff")
	var got struct {
		Argv  []string          `json:"argv"`
		Cwd   string            `json:"cwd"`
		Env   map[string]string `json:"env"`
		Umask *int              `json:"umask"`
	}
	if err := json.Unmarshal(request([]string{"run", "job.yaml", "-q"}, "/some/where"), &got); err != nil {
		t.Fatal(err)
	}
	if strings.Join(got.Argv, " ") != "run job.yaml -q" || got.Cwd != "/some/where" || got.Umask == nil {
		t.Fatalf("request: %+v", got)
	}
	if v := got.Env["LAUNCHER_TEST"]; v != "a \"b\" \ufffd" { // Go's decoder makes U+FFFD of the lone surrogate
		t.Fatalf("env: %q", v)
	}
}
