// SPDX-License-Identifier: Apache-2.0

package checkpoint

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"reflect"
	"testing"
)

// FuzzDecode feeds arbitrary bytes to the checkpoint reader twice: as a whole file,
// and as the records of a file whose version and checksum are right, so that the
// fuzzer reaches the records' checks instead of stopping at the checksum. Decoding
// must never panic, every record it accepts must validate, and writing the records
// back must give the same records.
func FuzzDecode(f *testing.F) {
	good, err := encode(map[string]Record{"a": rec("a"), "b": rec("b")})
	if err != nil {
		f.Fatal(err)
	}
	var g file
	if err := json.Unmarshal(good, &g); err != nil {
		f.Fatal(err)
	}
	for _, seed := range [][]byte{good, g.Records, []byte("[]"), []byte("null"), []byte(`[{"containerID":""}]`),
		[]byte(`[{"containerID":"a"},{"containerID":"a"}]`), []byte(`{"version":1,"checksum":"","records":[]}`)} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		check(t, data)
		sum := sha256.Sum256(data)
		wrapped, err := json.Marshal(struct {
			Version  int             `json:"version"`
			Checksum string          `json:"checksum"`
			Records  json.RawMessage `json:"records"`
		}{Version, hex.EncodeToString(sum[:]), data})
		if err != nil {
			return // not JSON: json.Marshal validates a RawMessage
		}
		check(t, wrapped)
	})
}

func check(t *testing.T, data []byte) {
	recs, err := decode(data)
	if err != nil {
		return
	}
	for id, r := range recs {
		if id != r.ContainerID {
			t.Fatalf("record %q filed under %q", r.ContainerID, id)
		}
		if err := r.Validate(); err != nil {
			t.Fatalf("decoded a record that does not validate: %v", err)
		}
	}
	again, err := encode(recs)
	if err != nil {
		t.Fatalf("decoded records do not encode: %v", err)
	}
	recs2, err := decode(again)
	if err != nil {
		t.Fatalf("encoding does not decode: %v\n%s", err, again)
	}
	if !equalRecords(recs, recs2) {
		t.Fatalf("round trip changed the records:\n%+v\n%+v", recs, recs2)
	}
}

// equalRecords compares records by their encoding: BoundAt's monotonic clock reading
// and location pointer do not survive JSON, and need not.
func equalRecords(a, b map[string]Record) bool {
	ja, _ := json.Marshal(a)
	jb, _ := json.Marshal(b)
	return reflect.DeepEqual(ja, jb)
}
