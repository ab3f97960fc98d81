package sdk

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"reflect"
	"slices"
	"strings"
	"time"
)

// A plugin declares its configuration as a Go struct whose fields carry a
// `reaper:"name"` tag (and a `help:"..."` tag for people):
//
//	type Config struct {
//		Threshold time.Duration `reaper:"threshold" help:"how long an attempt may wait"`
//		Policy    string        `reaper:"policy"`
//	}
//
// SchemaOf declares it (the field values of the struct given are the
// defaults), and Values.Decode reads a decoded block back into it. Field
// types: string (and string kinds), bool, int and float64 (numbers; an int
// must be whole), time.Duration (an HCL string such as "90s"), []string.
// The fields of an embedded struct count as the outer struct's own, so
// shared settings compose. A struct (outer or embedded) with a Validate
// method is validated once decoded.

// AttributeError is Decode's refusal of one attribute's value: a value of
// the wrong type, or a fraction for a whole number.
type AttributeError struct {
	Name string // the attribute
	Err  error  // what is wrong with its value
}

func (e *AttributeError) Error() string { return fmt.Sprintf("attribute %q: %v", e.Name, e.Err) }

func (e *AttributeError) Unwrap() error { return e.Err }

// Validator is a configuration struct that checks itself once decoded.
type Validator interface {
	Validate() error
}

var durationType = reflect.TypeFor[time.Duration]()

type field struct {
	name, help string
	required   bool
	index      []int
	typ        reflect.Type
}

// fieldsOf lists the tagged fields of struct type t, embedded ones inline.
func fieldsOf(t reflect.Type, prefix []int) ([]field, error) {
	var out []field
	for i := range t.NumField() {
		sf := t.Field(i)
		idx := append(slices.Clone(prefix), i)
		tag, tagged := sf.Tag.Lookup("reaper")
		if sf.Anonymous && !tagged && sf.Type.Kind() == reflect.Struct {
			inner, err := fieldsOf(sf.Type, idx)
			if err != nil {
				return nil, err
			}
			out = append(out, inner...)
			continue
		}
		if !tagged || tag == "-" {
			continue
		}
		name, opts, _ := strings.Cut(tag, ",")
		if name == "" {
			return nil, fmt.Errorf("field %s: empty attribute name", sf.Name)
		}
		if _, err := attrType(sf.Type); err != nil {
			return nil, fmt.Errorf("field %s: %w", sf.Name, err)
		}
		out = append(out, field{name: name, help: sf.Tag.Get("help"), required: opts == "required",
			index: idx, typ: sf.Type})
	}
	return out, nil
}

func attrType(t reflect.Type) (AttrType, error) {
	switch {
	case t == durationType:
		return TypeDuration, nil
	case t.Kind() == reflect.String:
		return TypeString, nil
	case t.Kind() == reflect.Bool:
		return TypeBool, nil
	case t.Kind() == reflect.Int, t.Kind() == reflect.Float64:
		return TypeNumber, nil
	case t.Kind() == reflect.Slice && t.Elem().Kind() == reflect.String:
		return TypeStrings, nil
	}
	return "", fmt.Errorf("type %s cannot be a configuration attribute", t)
}

func structOf(v any) (reflect.Value, error) {
	rv := reflect.ValueOf(v)
	for rv.Kind() == reflect.Pointer && !rv.IsNil() {
		rv = rv.Elem()
	}
	if rv.Kind() != reflect.Struct {
		return reflect.Value{}, fmt.Errorf("configuration must be a struct, not %T", v)
	}
	return rv, nil
}

// SchemaOf declares the configuration struct given: one attribute per
// tagged field, its current value the default. It panics on a struct that
// cannot be a configuration (a programming error, caught by any test).
func SchemaOf(defaults any) Schema {
	rv, err := structOf(defaults)
	if err != nil {
		panic("sdk.SchemaOf: " + err.Error())
	}
	fields, err := fieldsOf(rv.Type(), nil)
	if err != nil {
		panic("sdk.SchemaOf: " + err.Error())
	}
	s := Schema{Attributes: make([]Attribute, 0, len(fields))}
	for _, f := range fields {
		typ, _ := attrType(f.typ)
		a := Attribute{Name: f.name, Type: typ, Required: f.required, Description: f.help}
		if !f.required {
			a.Default = defaultOf(rv.FieldByIndex(f.index))
		}
		s.Attributes = append(s.Attributes, a)
	}
	return s
}

// defaultOf is a field's value as Values carries it.
func defaultOf(v reflect.Value) any {
	switch {
	case v.Type() == durationType:
		return time.Duration(v.Int()).String()
	case v.Kind() == reflect.String:
		return v.String()
	case v.Kind() == reflect.Bool:
		return v.Bool()
	case v.Kind() == reflect.Int:
		return float64(v.Int())
	case v.Kind() == reflect.Float64:
		return v.Float()
	case v.Kind() == reflect.Slice:
		out := make([]string, v.Len())
		for i := range out {
			out[i] = v.Index(i).String()
		}
		return out
	}
	return nil
}

// Decode reads the block into the struct out points to, field by tagged
// field; a key of v that no field takes, or a value of the wrong type, is an
// error naming the attribute. Attributes absent from v leave their field as
// it was (its default). Once read, every Validator of the struct (embedded
// ones first) is called.
func (v Values) Decode(out any) error {
	rv := reflect.ValueOf(out)
	if rv.Kind() != reflect.Pointer || rv.IsNil() || rv.Elem().Kind() != reflect.Struct {
		return fmt.Errorf("decode configuration: want a pointer to a struct, not %T", out)
	}
	rv = rv.Elem()
	fields, err := fieldsOf(rv.Type(), nil)
	if err != nil {
		return fmt.Errorf("decode configuration: %w", err)
	}
	known := make(map[string]bool, len(fields))
	for _, f := range fields {
		known[f.name] = true
		raw, ok := v[f.name]
		if !ok || raw == nil {
			if f.required {
				return fmt.Errorf("attribute %q: required", f.name)
			}
			continue
		}
		if err := setField(rv.FieldByIndex(f.index), raw); err != nil {
			return &AttributeError{Name: f.name, Err: err}
		}
	}
	keys := make([]string, 0, len(v))
	for k := range v {
		if !known[k] {
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		slices.Sort(keys)
		return fmt.Errorf("attribute %q: not a setting of this plugin", keys[0])
	}
	return validateAll(rv)
}

// validateAll calls Validate on the embedded structs of rv, then on rv
// itself. A Validate that rv only has by promotion from an embedded struct
// answers as that struct did; its error is not repeated.
func validateAll(rv reflect.Value) error {
	var errs []error
	seen := map[string]bool{}
	add := func(err error) {
		if err != nil && !seen[err.Error()] {
			seen[err.Error()] = true
			errs = append(errs, err)
		}
	}
	for i := range rv.NumField() {
		sf := rv.Type().Field(i)
		if sf.Anonymous && sf.Type.Kind() == reflect.Struct && sf.IsExported() {
			add(validateAll(rv.Field(i)))
		}
	}
	if val, ok := rv.Addr().Interface().(Validator); ok {
		add(val.Validate())
	}
	return errors.Join(errs...)
}

func setField(f reflect.Value, raw any) error {
	switch {
	case f.Type() == durationType:
		var d time.Duration
		switch x := raw.(type) {
		case string:
			parsed, err := time.ParseDuration(x)
			if err != nil {
				return fmt.Errorf("not a duration: %w", err)
			}
			d = parsed
		case time.Duration:
			d = x
		default:
			return fmt.Errorf("must be a duration string such as \"90s\", got %T", raw)
		}
		f.SetInt(int64(d))
	case f.Kind() == reflect.String:
		s, ok := raw.(string)
		if !ok {
			return fmt.Errorf("must be a string, got %T", raw)
		}
		f.SetString(s)
	case f.Kind() == reflect.Bool:
		b, ok := raw.(bool)
		if !ok {
			return fmt.Errorf("must be a bool, got %T", raw)
		}
		f.SetBool(b)
	case f.Kind() == reflect.Int, f.Kind() == reflect.Float64:
		n, err := toNumber(raw)
		if err != nil {
			return err
		}
		if f.Kind() == reflect.Float64 {
			f.SetFloat(n)
			return nil
		}
		if n != math.Trunc(n) || n < math.MinInt32 || n > math.MaxInt32 {
			return fmt.Errorf("must be a whole number, got %g", n)
		}
		f.SetInt(int64(n))
	case f.Kind() == reflect.Slice:
		var out []string
		switch l := raw.(type) {
		case []string:
			out = slices.Clone(l)
		case []any:
			for _, e := range l {
				s, ok := e.(string)
				if !ok {
					return fmt.Errorf("must be a list of strings, got an element of type %T", e)
				}
				out = append(out, s)
			}
		default:
			return fmt.Errorf("must be a list of strings, got %T", raw)
		}
		f.Set(reflect.ValueOf(out).Convert(f.Type()))
	}
	return nil
}

func toNumber(raw any) (float64, error) {
	var n float64
	switch x := raw.(type) {
	case float64:
		n = x
	case int:
		n = float64(x)
	case int64:
		n = float64(x)
	case json.Number:
		f, err := x.Float64()
		if err != nil {
			return 0, fmt.Errorf("not a number: %w", err)
		}
		n = f
	default:
		return 0, fmt.Errorf("must be a number, got %T", raw)
	}
	if math.IsNaN(n) || math.IsInf(n, 0) {
		return 0, errors.New("must be a finite number")
	}
	return n, nil
}
