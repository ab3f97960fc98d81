package sdk

import (
	"encoding/json"
	"fmt"
	"time"
)

// AttrType is the type of a configuration attribute.
type AttrType string

// Attribute types. Durations are written as HCL strings ("90s", "10m").
const (
	TypeString   AttrType = "string"
	TypeNumber   AttrType = "number"
	TypeBool     AttrType = "bool"
	TypeDuration AttrType = "duration"
	TypeStrings  AttrType = "list(string)"
)

// Attribute declares one key of a plugin's configuration block.
type Attribute struct {
	Name        string
	Type        AttrType
	Required    bool
	Default     any // a value of the attribute's Go type (see Values); nil: none
	Description string
}

// Schema is a plugin's configuration block: a flat set of attributes.
type Schema struct {
	Attributes []Attribute
}

// Values is a decoded configuration block. Keys are attribute names; values
// are string, float64, bool, []string, or a duration string for durations.
// Attributes left out of the block carry their default.
type Values map[string]any

// String returns the string value of key, or "".
func (v Values) String(key string) string {
	s, _ := v[key].(string)
	return s
}

// Bool returns the bool value of key, or false.
func (v Values) Bool(key string) bool {
	b, _ := v[key].(bool)
	return b
}

// Number returns the numeric value of key, or 0.
func (v Values) Number(key string) float64 {
	switch n := v[key].(type) {
	case float64:
		return n
	case int:
		return float64(n)
	case int64:
		return float64(n)
	case json.Number:
		f, _ := n.Float64()
		return f
	}
	return 0
}

// Duration returns the duration value of key (0 when unset). The host has
// already checked that it parses.
func (v Values) Duration(key string) (time.Duration, error) {
	switch d := v[key].(type) {
	case nil:
		return 0, nil
	case string:
		if d == "" {
			return 0, nil
		}
		parsed, err := time.ParseDuration(d)
		if err != nil {
			return 0, fmt.Errorf("attribute %q: %w", key, err)
		}
		return parsed, nil
	case time.Duration:
		return d, nil
	}
	return 0, fmt.Errorf("attribute %q: not a duration", key)
}

// Strings returns the list value of key.
func (v Values) Strings(key string) []string {
	switch l := v[key].(type) {
	case []string:
		return l
	case []any:
		out := make([]string, 0, len(l))
		for _, e := range l {
			if s, ok := e.(string); ok {
				out = append(out, s)
			}
		}
		return out
	}
	return nil
}

// WithDefaults returns a copy of v where every attribute of s that v lacks
// carries its default.
func (s Schema) WithDefaults(v Values) Values {
	out := Values{}
	for _, a := range s.Attributes {
		if a.Default != nil {
			out[a.Name] = a.Default
		}
	}
	for k, val := range v {
		out[k] = val
	}
	return out
}
