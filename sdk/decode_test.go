package sdk_test

import (
	"testing"
	"time"

	"github.com/dexaflow/reaper/sdk"
)

// limits is embedded unexported, as shared settings are inside a package.
type limits struct {
	Timeout time.Duration `reaper:"timeout"`
	Conns   float64       `reaper:"max_connections"`
}

type server struct {
	Listen string `reaper:"listen,required"`
	limits
	Debug bool `reaper:"debug"`
}

// TestSchemaOfAndDecodeOfAnEmbeddedStruct: an embedded struct's fields,
// exported or not its type, are the outer struct's own, declared in field
// order where it is embedded, with the values given as defaults; Decode
// fills them and leaves what the values lack at its default.
func TestSchemaOfAndDecodeOfAnEmbeddedStruct(t *testing.T) {
	defaults := server{limits: limits{Timeout: 5 * time.Second, Conns: 64}}
	s := sdk.SchemaOf(defaults)
	want := []sdk.Attribute{
		{Name: "listen", Type: sdk.TypeString, Required: true},
		{Name: "timeout", Type: sdk.TypeDuration, Default: "5s"},
		{Name: "max_connections", Type: sdk.TypeNumber, Default: float64(64)},
		{Name: "debug", Type: sdk.TypeBool, Default: false},
	}
	if len(s.Attributes) != len(want) {
		t.Fatalf("schema %+v, want %+v", s.Attributes, want)
	}
	for i, a := range s.Attributes {
		if a != want[i] {
			t.Errorf("attribute %d: %+v, want %+v", i, a, want[i])
		}
	}
	cfg := defaults
	if err := (sdk.Values{"listen": ":80", "max_connections": 1.5}).Decode(&cfg); err != nil {
		t.Fatal(err)
	}
	if cfg.Listen != ":80" || cfg.Conns != 1.5 || cfg.Timeout != 5*time.Second || cfg.Debug {
		t.Fatalf("decoded %+v", cfg)
	}
	if err := (sdk.Values{"timeout": "1s"}).Decode(&cfg); err == nil || err.Error() != `attribute "listen": required` {
		t.Fatalf("err = %v, want listen required", err)
	}
}
