// Package reap is the toolkit a reaper plugin is built from: Base, the
// Info, ConfigSchema and Configure every reaper serves, derived from its
// configuration struct and embedded in its Reaper; Run, one pass
// from a set of listings (the pass state that carries keyset cursors
// between passes, the drain bounded by the phase budget, the decisions
// handed to the pass's sink); the recorder of decisions and their evidence;
// Settle, guarded marks then what follows them (a teardown, a stop); the
// brake on marks decided on heartbeat silence alone; the orphan stop; and
// the settings every reaper shares (policy, drain bound, brake) as structs
// to embed in a configuration. Policy — which candidates, which signal,
// which label — stays in each reaper's package.
package reap

import (
	"encoding/json"
	"fmt"
	"maps"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// StateVersion is the version of the encoded pass state.
const StateVersion = 1

// Cursor is a keyset position saved between passes. TaskID is empty for run
// listings.
type Cursor struct {
	At     time.Time `json:"at"`
	RunID  string    `json:"run"`
	TaskID string    `json:"task,omitempty"`
}

// State is what a reaper hands back to the host after a pass and receives
// with the next one: one cursor per listing that stopped on a full page.
// A listing without a cursor starts from its oldest row.
//
// Encoded as JSON: {"v":1,"cursors":{"<listing>":{"at":"<RFC 3339>","run":"…","task":"…"}}}.
type State struct {
	Version int               `json:"v"`
	Cursors map[string]Cursor `json:"cursors,omitempty"`
	// Owed lists, by kind, attempts a reaper still owes a follow-up that
	// must wait for the world to catch up (a try-log line written only once
	// a stopped attempt's processes are all gone, say): carried from pass
	// to pass until the reaper settles them.
	Owed map[string][]sdk.Attempt `json:"owed,omitempty"`
	// Notes are a reaper's own values carried from pass to pass (podlost's
	// change feed position, say), by name. A state that cannot be read
	// loses them with the cursors, so a reaper must treat a missing note as
	// "start over".
	Notes map[string]string `json:"notes,omitempty"`
}

// DecodeState reads a pass state. Empty input is the empty state. A state
// that cannot be read (corrupt, or written by another version) yields the
// empty state and an error saying why; the caller logs it and starts every
// listing over, which costs at most re-reading pages.
func DecodeState(b []byte) (State, error) {
	s := State{Version: StateVersion, Cursors: map[string]Cursor{}}
	if len(b) == 0 {
		return s, nil
	}
	var in State
	if err := json.Unmarshal(b, &in); err != nil {
		return s, fmt.Errorf("decode pass state: %w", err)
	}
	if in.Version != StateVersion {
		return s, fmt.Errorf("decode pass state: version %d, want %d", in.Version, StateVersion)
	}
	maps.Copy(s.Cursors, in.Cursors)
	s.Owed = in.Owed
	s.Notes = in.Notes
	return s, nil
}

// LoadState reads the pass's state like DecodeState, logging (to log, when
// not nil) why a state that cannot be read is started over.
func LoadState(pass sdk.Pass, log interface{ Warn(string, ...any) }) *State {
	st, err := DecodeState(pass.State)
	if err != nil && log != nil {
		log.Warn("starting every listing over", "error", err)
	}
	return &st
}

// Owe adds a to what is owed under kind.
func (s *State) Owe(kind string, a sdk.Attempt) {
	if s.Owed == nil {
		s.Owed = map[string][]sdk.Attempt{}
	}
	s.Owed[kind] = append(s.Owed[kind], a)
}

// TakeOwed returns what is owed under kind and forgets it: the caller owes
// again what it could not settle.
func (s *State) TakeOwed(kind string) []sdk.Attempt {
	owed := s.Owed[kind]
	delete(s.Owed, kind)
	return owed
}

// Encode writes the state; a state with no cursor encodes as nil.
func (s State) Encode() ([]byte, error) {
	if len(s.Cursors) == 0 && len(s.Owed) == 0 && len(s.Notes) == 0 {
		return nil, nil
	}
	s.Version = StateVersion
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode pass state: %w", err)
	}
	return b, nil
}

// Note returns the note under name ("" when none).
func (s *State) Note(name string) string { return s.Notes[name] }

// SetNote keeps value under name for the next pass; "" forgets it.
func (s *State) SetNote(name, value string) {
	if value == "" {
		delete(s.Notes, name)
		return
	}
	if s.Notes == nil {
		s.Notes = map[string]string{}
	}
	s.Notes[name] = value
}

// Candidate returns the listing's cursor as a candidate cursor (nil: start).
func (s State) Candidate(listing string) *sdk.Cursor {
	c, ok := s.Cursors[listing]
	if !ok {
		return nil
	}
	return &sdk.Cursor{At: c.At, RunID: c.RunID, TaskID: c.TaskID}
}

// Run returns the listing's cursor as a run cursor (nil: start).
func (s State) Run(listing string) *sdk.RunCursor {
	c, ok := s.Cursors[listing]
	if !ok {
		return nil
	}
	return &sdk.RunCursor{At: c.At, RunID: c.RunID}
}

// set saves the listing's cursor; nil forgets it, so the next pass starts
// from the oldest row.
func (s State) set(listing string, c *Cursor) {
	if c == nil {
		delete(s.Cursors, listing)
		return
	}
	s.Cursors[listing] = *c
}
