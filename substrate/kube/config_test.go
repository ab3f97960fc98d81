package kube

import (
	"context"
	"strings"
	"testing"

	"github.com/hashicorp/go-hclog"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/dexaflow/reaper/sdk"
)

func TestConfigSchemaDeclaresTheBlock(t *testing.T) {
	s := NewWithOptions(hclog.NewNullLogger(), Options{Client: fake.NewClientset()})
	schema, err := s.ConfigSchema(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"namespace": NamespaceDefault, "kubeconfig": "", "qps": float64(QPSDefault),
		"burst": float64(BurstDefault), "warm_pool_selector": WarmPoolSelectorDefault, "resync": "0s",
		"finalizer_max_age": "24h0m0s", "events": true}
	if len(schema.Attributes) != len(want) {
		t.Fatalf("attributes %+v, want %v", schema.Attributes, want)
	}
	for _, a := range schema.Attributes {
		if d, ok := want[a.Name]; !ok || a.Default != d || a.Description == "" {
			t.Errorf("attribute %s: default %v (%T), want %v; description %q", a.Name, a.Default, a.Default, d, a.Description)
		}
	}
}

func TestConfigureRefusesABadBlock(t *testing.T) {
	for _, tt := range []struct {
		name   string
		values sdk.Values
		want   string
	}{
		{"ZeroQPS", sdk.Values{"qps": 0.0}, `"qps"`},
		{"NoBurst", sdk.Values{"burst": 0.0}, `"burst"`},
		{"EmptyNamespace", sdk.Values{"namespace": ""}, `"namespace"`},
		{"BadSelector", sdk.Values{"warm_pool_selector": "a in (b"}, `"warm_pool_selector"`},
		{"FinalizerMaxAgeBelowTheCollection", sdk.Values{"finalizer_max_age": "5m"}, `"finalizer_max_age"`},
		{"LiteEdition", sdk.Values{}, "edition"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := NewWithOptions(hclog.NewNullLogger(), Options{Client: fake.NewClientset()})
			edition := "kube"
			if tt.name == "LiteEdition" {
				edition = "lite"
			}
			err := s.Configure(context.Background(), sdk.ConfigureRequest{Edition: edition, Values: tt.values})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Configure: %v, want an error naming %s", err, tt.want)
			}
			s.Close()
		})
	}
}
