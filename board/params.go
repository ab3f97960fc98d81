package board

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// The parallel arrays of a batch statement (one element per request) go
// to pgx as textArray, timeArray and nullTimeArray rather than as
// []string, []time.Time and []pgtype.Timestamptz. pgx encodes an array
// parameter element by element through ArrayGetter.Index, which returns
// the element as an any: for a []string or a []time.Time that boxes, so
// allocates, every element (six of a mark's arrays are text). These
// return a pointer into the slice instead, which an any holds without
// allocating. The statement receives the same text[] and timestamptz[]
// values, byte for byte: each element still encodes as a text or a
// timestamptz.

// textArray is a text[] parameter.
type textArray []string

// textElem is an element of a textArray: a text, never NULL.
type textElem string

func (t *textElem) TextValue() (pgtype.Text, error) {
	return pgtype.Text{String: string(*t), Valid: true}, nil
}

func (a textArray) Dimensions() []pgtype.ArrayDimension { return dimensions(len(a), a == nil) }
func (a textArray) Index(i int) any                     { return (*textElem)(&a[i]) }
func (a textArray) IndexType() any                      { return (*textElem)(nil) }

// timeArray is a timestamptz[] parameter whose elements are never NULL
// (a zero time is sent as itself, as pgx sends a time.Time).
type timeArray []time.Time

// timeElem is an element of a timeArray.
type timeElem time.Time

func (t *timeElem) TimestamptzValue() (pgtype.Timestamptz, error) {
	return pgtype.Timestamptz{Time: time.Time(*t), Valid: true}, nil
}

func (a timeArray) Dimensions() []pgtype.ArrayDimension { return dimensions(len(a), a == nil) }
func (a timeArray) Index(i int) any                     { return (*timeElem)(&a[i]) }
func (a timeArray) IndexType() any                      { return (*timeElem)(nil) }

// nullTimeArray is a timestamptz[] parameter with NULL elements (Valid
// false).
type nullTimeArray []pgtype.Timestamptz

func (a nullTimeArray) Dimensions() []pgtype.ArrayDimension { return dimensions(len(a), a == nil) }
func (a nullTimeArray) Index(i int) any                     { return &a[i] }
func (a nullTimeArray) IndexType() any                      { return (*pgtype.Timestamptz)(nil) }

// dimensions are those of a one-dimensional array of n elements; none
// (the parameter is NULL) for a nil slice, as for pgx's own slices.
func dimensions(n int, isNil bool) []pgtype.ArrayDimension {
	if isNil {
		return nil
	}
	return []pgtype.ArrayDimension{{Length: int32(n), LowerBound: 1}}
}
