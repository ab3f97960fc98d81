package attempttoken_test

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dexaflow/reaper/runner/attempttoken"
	"github.com/dexaflow/reaper/runner/attempttoken/keyfile"
	"github.com/dexaflow/reaper/sdk"
)

var t0 = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func key(t *testing.T, id string) attempttoken.Key {
	t.Helper()
	return attempttoken.Key{ID: id, Secret: bytes.Repeat([]byte(id[:1]), 32)}
}

func ring(t *testing.T, current attempttoken.Key, previous ...attempttoken.Key) *attempttoken.Keyring {
	t.Helper()
	kr, err := attempttoken.NewKeyring(current, previous...)
	if err != nil {
		t.Fatal(err)
	}
	return kr
}

func TestToken(t *testing.T) {
	a := sdk.Attempt{RunID: "run-1", TaskID: "extract.part", Try: 2, Epoch: 3}
	kr := ring(t, key(t, "a1"))

	t.Run("MintedTokenVerifiesForItsAttemptOnly", func(t *testing.T) {
		tok, _, err := kr.Mint(a, t0, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		c, err := kr.VerifyFor(tok, a, t0.Add(time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if c.Attempt != a || !c.MintedAt.Equal(t0) || !c.ExpiresAt.Equal(t0.Add(10*time.Minute)) {
			t.Fatalf("claims %+v", c)
		}
		for name, other := range map[string]sdk.Attempt{
			"AnotherTry":   {RunID: a.RunID, TaskID: a.TaskID, Try: 3, Epoch: 3},
			"AnotherEpoch": {RunID: a.RunID, TaskID: a.TaskID, Try: 2, Epoch: 4},
			"AnotherTask":  {RunID: a.RunID, TaskID: "load", Try: 2, Epoch: 3},
			"AnotherRun":   {RunID: "run-2", TaskID: a.TaskID, Try: 2, Epoch: 3},
		} {
			if _, err := kr.VerifyFor(tok, other, t0); !errors.Is(err, attempttoken.ErrWrongScope) {
				t.Errorf("%s: err %v, want ErrWrongScope", name, err)
			}
		}
	})
	t.Run("ExpiredTokenRefused", func(t *testing.T) {
		tok, _, _ := kr.Mint(a, t0, 10*time.Minute)
		if _, err := kr.Verify(tok, t0.Add(10*time.Minute)); !errors.Is(err, attempttoken.ErrExpired) {
			t.Fatalf("err %v, want ErrExpired", err)
		}
	})
	t.Run("ForgedTokenRefused", func(t *testing.T) {
		tok, _, _ := kr.Mint(a, t0, 10*time.Minute)
		parts := strings.Split(tok, ".")
		// Another attempt's payload under this token's signature.
		other, _, _ := kr.Mint(sdk.Attempt{RunID: "run-2", TaskID: "x"}, t0, 10*time.Minute)
		parts[2] = strings.Split(other, ".")[2]
		if _, err := kr.Verify(strings.Join(parts, "."), t0); !errors.Is(err, attempttoken.ErrForged) {
			t.Fatalf("swapped payload: err %v, want ErrForged", err)
		}
		// Signed with a key of the same id but another secret.
		evil := ring(t, attempttoken.Key{ID: "a1", Secret: bytes.Repeat([]byte("z"), 32)})
		etok, _, _ := evil.Mint(a, t0, time.Hour)
		if _, err := kr.Verify(etok, t0); !errors.Is(err, attempttoken.ErrForged) {
			t.Fatalf("other secret: err %v, want ErrForged", err)
		}
		// Signed with a key this keyring never held.
		utok, _, _ := ring(t, key(t, "x9")).Mint(a, t0, time.Hour)
		if _, err := kr.Verify(utok, t0); !errors.Is(err, attempttoken.ErrUnknownKey) {
			t.Fatalf("unknown key: err %v, want ErrUnknownKey", err)
		}
		for _, junk := range []string{"", "rat1", "rat1.a1.!!.??", "Bearer x", "rat2.a1.AA.AA"} {
			if _, err := kr.Verify(junk, t0); err == nil {
				t.Errorf("%q verified", junk)
			}
		}
	})
	t.Run("RenewalKeepsTheFirstMintTime", func(t *testing.T) {
		_, c, _ := kr.Mint(a, t0, 10*time.Minute)
		tok, rc, err := kr.Renew(c, t0.Add(9*time.Minute), 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		got, err := kr.Verify(tok, t0.Add(15*time.Minute))
		if err != nil {
			t.Fatal(err)
		}
		if !got.MintedAt.Equal(t0) || !got.IssuedAt.Equal(t0.Add(9*time.Minute)) || got != rc {
			t.Fatalf("renewed claims %+v", got)
		}
	})
	t.Run("RotationVerifiesWithThePreviousKey", func(t *testing.T) {
		old := ring(t, key(t, "a1"))
		tok, c, _ := old.Mint(a, t0, 10*time.Minute)
		rotated := ring(t, key(t, "b2"), key(t, "a1"))
		if _, err := rotated.VerifyFor(tok, a, t0.Add(time.Minute)); err != nil {
			t.Fatalf("a live token of the previous key: %v", err)
		}
		renewed, _, _ := rotated.Renew(c, t0.Add(time.Minute), 10*time.Minute)
		if !strings.HasPrefix(renewed, "rat1.b2.") {
			t.Fatalf("renewal not signed with the current key: %s", renewed)
		}
		retired := ring(t, key(t, "b2"))
		if _, err := retired.Verify(tok, t0.Add(time.Minute)); !errors.Is(err, attempttoken.ErrUnknownKey) {
			t.Fatalf("retired key: err %v, want ErrUnknownKey", err)
		}
	})
	t.Run("ShortSecretRefused", func(t *testing.T) {
		if _, err := attempttoken.NewKeyring(attempttoken.Key{ID: "k", Secret: []byte("short")}); err == nil {
			t.Fatal("accepted a short secret")
		}
	})
}

func TestKeyFile(t *testing.T) {
	t.Run("RoundTripsCurrentAndPrevious", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "keys.hcl")
		if err := os.WriteFile(path, keyfile.Format(key(t, "b2"), key(t, "a1")), 0o600); err != nil {
			t.Fatal(err)
		}
		kr, err := keyfile.Load(path)
		if err != nil {
			t.Fatal(err)
		}
		if kr.CurrentID() != "b2" {
			t.Fatalf("current %q", kr.CurrentID())
		}
		a := sdk.Attempt{RunID: "r", TaskID: "t"}
		tok, _, _ := ring(t, key(t, "a1")).Mint(a, t0, time.Minute)
		if _, err := kr.Verify(tok, t0); err != nil {
			t.Fatalf("previous key: %v", err)
		}
	})
	t.Run("BadFileNamesTheLine", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "keys.hcl")
		os.WriteFile(path, []byte("current \"k\" {\n  secret = \"c2hvcnQ=\"\n}\n"), 0o600)
		_, err := keyfile.Load(path)
		if err == nil || !strings.Contains(err.Error(), "keys.hcl:1") {
			t.Fatalf("err %v, want a diagnostic at keys.hcl:1", err)
		}
	})
	t.Run("GeneratedOnceAndSharedByReplicas", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "state", "keys.hcl")
		var wg sync.WaitGroup
		ids := make([]string, 4)
		errs := make([]error, 4)
		for i := range ids {
			wg.Add(1)
			go func() {
				defer wg.Done()
				kr, err := keyfile.LoadOrCreate(path)
				errs[i] = err
				if err == nil {
					ids[i] = kr.CurrentID()
				}
			}()
		}
		wg.Wait()
		for i := range ids {
			if errs[i] != nil || ids[i] != ids[0] {
				t.Fatalf("replica %d: id %q err %v; replica 0: %q", i, ids[i], errs[i], ids[0])
			}
		}
		st, _ := os.Stat(path)
		if st.Mode().Perm() != 0o600 {
			t.Fatalf("key file mode %v", st.Mode())
		}
	})
}

func TestIssuer(t *testing.T) {
	t.Run("MintPutsBootstrapTokenAddressAndCAInTheEnvironment", func(t *testing.T) {
		kr := ring(t, key(t, "a1"))
		is := attempttoken.Issuer{Keys: func() *attempttoken.Keyring { return kr }, TTL: 10 * time.Minute,
			API: "https://127.0.0.1:9465", CA: "-----BEGIN CERTIFICATE-----"}
		a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
		cred, err := is.Mint(a, t0)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{attempttoken.EnvToken + "=" + cred.Token, attempttoken.EnvAPI + "=https://127.0.0.1:9465",
			attempttoken.EnvCA + "=-----BEGIN CERTIFICATE-----"}
		if strings.Join(cred.Env, "\n") != strings.Join(want, "\n") {
			t.Fatalf("env %q", cred.Env)
		}
		if _, err := kr.VerifyBootstrapFor(cred.Token, a, t0); err != nil {
			t.Fatal(err)
		}
	})
}

func TestWorkerToken(t *testing.T) {
	kr := ring(t, key(t, "a1"))
	a := sdk.Attempt{RunID: "run-1", TaskID: "t", Try: 1}

	t.Run("MintedWorkerTokenVerifiesWithItsWorker", func(t *testing.T) {
		tok, _, err := kr.MintWorker("reaper-warm-x1", t0, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		c, err := kr.VerifyWorker(tok, t0.Add(time.Minute))
		if err != nil || c.Worker != "reaper-warm-x1" || !c.ExpiresAt.Equal(t0.Add(10*time.Minute)) {
			t.Fatalf("claims %+v, %v", c, err)
		}
		if _, err := kr.VerifyWorker(tok, t0.Add(10*time.Minute)); !errors.Is(err, attempttoken.ErrExpired) {
			t.Fatalf("expired worker token: %v", err)
		}
	})
	t.Run("WorkerRenewalKeepsTheFirstMintTime", func(t *testing.T) {
		tok, c, err := kr.MintWorker("w", t0, 10*time.Minute)
		if err != nil || !c.MintedAt.Equal(t0) {
			t.Fatalf("minted %+v, %v", c, err)
		}
		later := t0.Add(5 * time.Minute)
		c, err = kr.VerifyWorker(tok, later)
		if err != nil {
			t.Fatal(err)
		}
		renewed, rc, err := kr.RenewWorker(c, later, 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		got, err := kr.VerifyWorker(renewed, later.Add(9*time.Minute))
		if err != nil || !got.MintedAt.Equal(t0) || !got.IssuedAt.Equal(later) || !got.ExpiresAt.Equal(rc.ExpiresAt) ||
			got.Worker != "w" {
			t.Fatalf("renewed claims %+v, %v: want the first mint %s kept", got, err, t0)
		}
	})
	t.Run("WorkerTokenCannotActForAnAttempt", func(t *testing.T) {
		tok, _, err := kr.MintWorker("w", t0, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kr.Verify(tok, t0); !errors.Is(err, attempttoken.ErrWrongKind) {
			t.Fatalf("a worker token verified as an attempt token: %v", err)
		}
		if _, err := kr.VerifyFor(tok, a, t0); !errors.Is(err, attempttoken.ErrWrongKind) {
			t.Fatalf("a worker token verified for an attempt: %v", err)
		}
	})
	t.Run("AttemptTokenCannotClaim", func(t *testing.T) {
		tok, _, err := kr.Mint(a, t0, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kr.VerifyWorker(tok, t0); !errors.Is(err, attempttoken.ErrWrongKind) {
			t.Fatalf("an attempt token verified as a worker token: %v", err)
		}
	})
	t.Run("RelabelledKindIsForged", func(t *testing.T) {
		tok, _, err := kr.Mint(a, t0, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kr.VerifyWorker("rwt1"+strings.TrimPrefix(tok, "rat1"), t0); err == nil {
			t.Fatal("an attempt token relabelled as a worker token was accepted")
		}
		wt, _, err := kr.MintWorker("w", t0, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := kr.Verify("rat1"+strings.TrimPrefix(wt, "rwt1"), t0); !errors.Is(err, attempttoken.ErrForged) {
			t.Fatalf("a worker token relabelled as an attempt token: %v", err)
		}
	})
	t.Run("OtherKeyringRefuses", func(t *testing.T) {
		tok, _, err := kr.MintWorker("w", t0, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := ring(t, key(t, "b1")).VerifyWorker(tok, t0); !errors.Is(err, attempttoken.ErrUnknownKey) {
			t.Fatalf("%v", err)
		}
	})
}

// A bootstrap token is its own kind: only VerifyBootstrapFor accepts it,
// for exactly its attempt, until one TTL after its mint; it never passes
// as an attempt or a worker token, and neither of those passes as it.
func TestBootstrapTokenIsItsOwnKind(t *testing.T) {
	kr, err := attempttoken.NewKeyring(attempttoken.Key{ID: "k1", Secret: make([]byte, attempttoken.MinSecretLen)})
	if err != nil {
		t.Fatal(err)
	}
	now := time.Date(2030, 1, 2, 12, 0, 0, 0, time.UTC)
	a := sdk.Attempt{RunID: "r", TaskID: "t", Try: 1}
	boot, c, err := kr.MintBootstrap(a, now, 10*time.Minute)
	if err != nil || !attempttoken.IsBootstrap(boot) {
		t.Fatalf("mint: %q %v", boot, err)
	}
	if got, err := kr.VerifyBootstrapFor(boot, a, now.Add(time.Minute)); err != nil || got != c {
		t.Fatalf("verify: %+v %v, want %+v", got, err, c)
	}
	if _, err := kr.VerifyBootstrapFor(boot, sdk.Attempt{RunID: "r", TaskID: "t", Try: 1, Epoch: 1}, now); !errors.Is(err, attempttoken.ErrWrongScope) {
		t.Fatalf("another attempt: %v, want attempttoken.ErrWrongScope", err)
	}
	if _, err := kr.VerifyBootstrapFor(boot, a, now.Add(10*time.Minute)); !errors.Is(err, attempttoken.ErrExpired) {
		t.Fatalf("one TTL after the mint: %v, want attempttoken.ErrExpired", err)
	}
	if _, err := kr.Verify(boot, now); !errors.Is(err, attempttoken.ErrWrongKind) {
		t.Fatalf("as an attempt token: %v, want attempttoken.ErrWrongKind", err)
	}
	if _, err := kr.VerifyWorker(boot, now); !errors.Is(err, attempttoken.ErrWrongKind) {
		t.Fatalf("as a worker token: %v, want attempttoken.ErrWrongKind", err)
	}
	work, _, _ := kr.Mint(a, now, 10*time.Minute)
	worker, _, _ := kr.MintWorker("w", now, 10*time.Minute)
	for _, tok := range []string{work, worker} {
		if _, err := kr.VerifyBootstrapFor(tok, a, now); !errors.Is(err, attempttoken.ErrWrongKind) {
			t.Fatalf("%.4s as a bootstrap token: %v, want attempttoken.ErrWrongKind", tok, err)
		}
		if attempttoken.IsBootstrap(tok) {
			t.Fatalf("%.4s reads as a bootstrap token", tok)
		}
	}
	// The kind is covered by the MAC: relabelling a bootstrap token as an
	// attempt token breaks its signature.
	if _, err := kr.Verify("rat1"+strings.TrimPrefix(boot, "rbt1"), now); !errors.Is(err, attempttoken.ErrForged) {
		t.Fatalf("a relabelled bootstrap token: %v, want attempttoken.ErrForged", err)
	}
}
