// SPDX-License-Identifier: Apache-2.0

//go:build cgo

package difffuzz

import (
	"testing"

	"github.com/tessera-dev/tessera/node-agent/bindserver"
)

// compareReply runs the hook's and the agent's reply readers over data and fails on
// any difference: the kind, the size of an ok reply, or the reason of a refusal.
func compareReply(t *testing.T, data []byte) (bindserver.ReplyKind, int) {
	p, release := guardedCopy(t, data)
	defer release()
	ck, csize, ctext := ParseReply(p, len(data))
	gk, gsize, gtext := bindserver.ParseReply(data)
	want := map[bindserver.ReplyKind]int{bindserver.ReplyOK: 0, bindserver.ReplyRefused: 1, bindserver.ReplyMalformed: -1}[gk]
	if ck != want || csize != gsize {
		t.Fatalf("the readers disagree on %q:\nC:  kind %d size %d %q\nGo: kind %d size %d %q", data, ck, csize, ctext, gk, gsize, gtext)
	}
	if gk == bindserver.ReplyRefused && len(gtext) < 399 && ctext != gtext {
		t.Fatalf("the readers show the refusal %q differently:\nC:  %q\nGo: %q", data, ctext, gtext)
	}
	return gk, gsize
}

// replies are what the agent writes and the near misses either reader could take for it.
var replies = []string{
	"ok 1\n", "ok 123\n", "ok 65536\n", "ok 65537\n", "ok 0\n", "ok 010\n", "ok +5\n", "ok -5\n", "ok 5 x\n",
	"ok 5\n\n", "ok 5", "ok \n", "ok\n", "ok 99999999999\n", "ok 4294967297\n", "OK 5\n", " ok 5\n",
	"error pod team/x is not a pod of this node\n", "error \n", "error a\nb\n", "error \x00\x7f\xff\n", "error\n", "\n", "",
}

// The agent's replies and their near misses: both readers decide the same, and the
// agent's own forms are read as it means them.
func TestReplyVectors(t *testing.T) {
	for _, r := range replies {
		compareReply(t, []byte(r))
	}
	for r, want := range map[string]int{"ok 1\n": 1, "ok 65536\n": 65536} {
		if k, size := compareReply(t, []byte(r)); k != bindserver.ReplyOK || size != want {
			t.Errorf("%q: kind %d size %d", r, k, size)
		}
	}
	for _, r := range []string{"ok 0\n", "ok 010\n", "ok +5\n", "ok 5 x\n", "ok 65537\n", "error a\nb\n", "ok 5"} {
		if k, _ := compareReply(t, []byte(r)); k != bindserver.ReplyMalformed {
			t.Errorf("%q accepted", r)
		}
	}
}

func FuzzBindReply(f *testing.F) {
	for _, r := range replies {
		f.Add([]byte(r))
	}
	f.Fuzz(func(t *testing.T, data []byte) { compareReply(t, data) })
}
