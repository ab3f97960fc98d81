package plugin

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/dexaflow/reaper/sdk"
	pb "github.com/dexaflow/reaper/sdk/plugin/proto/reaperv1"
)

// baseClient is the host's view of the Base service every plugin serves.
type baseClient struct {
	client pb.BaseClient
}

func (c *baseClient) Info(ctx context.Context) (sdk.Info, error) {
	resp, err := c.client.Info(ctx, &pb.Empty{})
	if err != nil {
		return sdk.Info{}, remoteError("plugin info", err)
	}
	return sdk.Info{Name: resp.Name, Kind: resp.Kind, Version: resp.Version,
		Editions: resp.Editions, Description: resp.Description, MarkReasons: resp.MarkReasons,
		DecisionLabels: resp.DecisionLabels, KillLabels: resp.KillLabels, ProvisionalLabels: resp.ProvisionalLabels}, nil
}

func (c *baseClient) ConfigSchema(ctx context.Context) (sdk.Schema, error) {
	resp, err := c.client.ConfigSchema(ctx, &pb.Empty{})
	if err != nil {
		return sdk.Schema{}, remoteError("plugin config schema", err)
	}
	s := sdk.Schema{Attributes: make([]sdk.Attribute, len(resp.Attributes))}
	for i, a := range resp.Attributes {
		attr := sdk.Attribute{Name: a.Name, Type: sdk.AttrType(a.Type), Required: a.Required, Description: a.Description}
		if a.DefaultJson != "" {
			if err := json.Unmarshal([]byte(a.DefaultJson), &attr.Default); err != nil {
				return sdk.Schema{}, fmt.Errorf("plugin config schema: default of %q: %w", a.Name, err)
			}
			attr.Default = normalizeJSONValue(attr.Type, attr.Default)
		}
		s.Attributes[i] = attr
	}
	return s, nil
}

func (c *baseClient) Configure(ctx context.Context, req sdk.ConfigureRequest) error {
	values, err := json.Marshal(req.Values)
	if err != nil {
		return fmt.Errorf("plugin configure: encode values: %w", err)
	}
	_, err = c.client.Configure(ctx, &pb.ConfigureRequest{
		Edition: req.Edition, ValuesJson: values, Ladder: ladderToPB(req.Ladder),
	})
	if err != nil {
		return remoteError("plugin configure", err)
	}
	return nil
}

// remoteError is what the host sees of a failed call. An error the plugin's
// own method returned travels as a status of code Unknown: it comes back as
// the plugin's sentence alone, without "rpc error: code = Unknown desc =" or
// a prefix of ours, since the plugin wrote it for the operator. Any other
// status is the transport failing, and says what was being done.
func remoteError(what string, err error) error {
	if st, ok := status.FromError(err); ok && st.Code() == codes.Unknown {
		return errors.New(st.Message())
	}
	return fmt.Errorf("%s: %w", what, err)
}

// baseServer serves a plugin's Base service.
type baseServer struct {
	pb.UnimplementedBaseServer
	impl sdk.Plugin
}

func (s *baseServer) Info(ctx context.Context, _ *pb.Empty) (*pb.InfoResponse, error) {
	info, err := s.impl.Info(ctx)
	if err != nil {
		return nil, err
	}
	return &pb.InfoResponse{Name: info.Name, Kind: info.Kind, Version: info.Version,
		Editions: info.Editions, Description: info.Description, MarkReasons: info.MarkReasons,
		DecisionLabels: info.DecisionLabels, KillLabels: info.KillLabels, ProvisionalLabels: info.ProvisionalLabels}, nil
}

func (s *baseServer) ConfigSchema(ctx context.Context, _ *pb.Empty) (*pb.SchemaResponse, error) {
	schema, err := s.impl.ConfigSchema(ctx)
	if err != nil {
		return nil, err
	}
	resp := &pb.SchemaResponse{Attributes: make([]*pb.AttributeSpec, len(schema.Attributes))}
	for i, a := range schema.Attributes {
		spec := &pb.AttributeSpec{Name: a.Name, Type: string(a.Type), Required: a.Required, Description: a.Description}
		if a.Default != nil {
			def, err := json.Marshal(a.Default)
			if err != nil {
				return nil, fmt.Errorf("encode default of %q: %w", a.Name, err)
			}
			spec.DefaultJson = string(def)
		}
		resp.Attributes[i] = spec
	}
	return resp, nil
}

func (s *baseServer) Configure(ctx context.Context, req *pb.ConfigureRequest) (*pb.Empty, error) {
	values := sdk.Values{}
	if len(req.ValuesJson) > 0 {
		if err := json.Unmarshal(req.ValuesJson, &values); err != nil {
			return nil, fmt.Errorf("decode configuration values: %w", err)
		}
	}
	for k, v := range values {
		if l, ok := v.([]any); ok {
			values[k] = normalizeJSONValue(sdk.TypeStrings, l)
		}
	}
	if err := s.impl.Configure(ctx, sdk.ConfigureRequest{Edition: req.Edition, Values: values, Ladder: ladderFromPB(req.Ladder)}); err != nil {
		return nil, err
	}
	return &pb.Empty{}, nil
}

// normalizeJSONValue turns a decoded JSON value back into the Go type Values
// documents for t.
func normalizeJSONValue(t sdk.AttrType, v any) any {
	if t == sdk.TypeStrings {
		if l, ok := v.([]any); ok {
			out := make([]string, 0, len(l))
			for _, e := range l {
				if s, ok := e.(string); ok {
					out = append(out, s)
				}
			}
			return out
		}
	}
	return v
}
