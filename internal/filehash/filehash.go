// SPDX-License-Identifier: Apache-2.0

// Package filehash is the SHA-256 of a file's content, as sha256sum prints it: the
// install-hook command checks the hook against the checksum the image build
// recorded with the same function that recorded it.
package filehash

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
)

// SHA256 returns the lower-case hex SHA-256 of the content of file.
func SHA256(file string) (string, error) {
	f, err := os.Open(file)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
