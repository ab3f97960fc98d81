package attempttoken

import (
	"encoding/binary"
	"fmt"
	"strings"
)

// Subject checks a token's envelope (a known kind, a key the keyring holds,
// its signature) and names whose it is: "attempt <run/task/try/epoch>" for
// an attempt or bootstrap token, "worker <name>" for a worker or worker
// bootstrap token. Expiry and scope are not checked: the attempt API counts
// a client's calls by its subject before it reads the call's body, and
// verifies the token in full afterwards. The error wraps one of the
// package's errors, as Verify's do.
func (kr *Keyring) Subject(token string) (string, error) {
	kind, _, _ := strings.Cut(token, ".")
	raw, err := kr.open(token, kind)
	if err != nil {
		return "", err
	}
	switch kind {
	case prefix, bootstrapPrefix:
		c, err := decode(raw)
		if err != nil {
			return "", fmt.Errorf("%w: %v", ErrMalformed, err)
		}
		return AttemptSubject(c), nil
	case workerPrefix, workerBootstrapPrefix:
		if len(raw) < 16 {
			return "", fmt.Errorf("%w: worker payload too short", ErrMalformed)
		}
		rest := raw[16:]
		n, k := binary.Uvarint(rest)
		if k <= 0 || n == 0 || n > uint64(len(rest)-k) {
			return "", fmt.Errorf("%w: worker name truncated", ErrMalformed)
		}
		return "worker " + string(rest[k:k+int(n)]), nil
	}
	return "", ErrMalformed
}
