package forward

import (
	"crypto/sha256"
	"fmt"
	"sync"

	"google.golang.org/protobuf/proto"
)

// encoded is a request message already marshaled by the signer, so the
// bytes sent are the bytes whose digest the header signs.
type encoded []byte

// clientCodec marshals an encoded message as is, and anything else
// deterministically; it unmarshals as the proto codec does.
type clientCodec struct{}

func (clientCodec) Name() string { return "proto" }

func (clientCodec) Marshal(v any) ([]byte, error) {
	if b, ok := v.(encoded); ok {
		return b, nil
	}
	return marshal(v)
}

func (clientCodec) Unmarshal(data []byte, v any) error { return unmarshal(data, v) }

// marshal is the deterministic proto encoding of v.
func marshal(v any) ([]byte, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("forward: cannot marshal %T: not a proto message", v)
	}
	return proto.MarshalOptions{Deterministic: true}.Marshal(m)
}

func unmarshal(data []byte, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("forward: cannot unmarshal into %T: not a proto message", v)
	}
	return proto.Unmarshal(data, m)
}

// serverCodec unmarshals as the proto codec does and keeps the digest of
// the bytes each message was read from, for the interceptors to take
// (digestOf): a server interceptor sees the message, never its bytes.
type serverCodec struct {
	digests *sync.Map // message pointer -> [sha256.Size]byte
}

func (serverCodec) Name() string { return "proto" }

func (serverCodec) Marshal(v any) ([]byte, error) { return marshal(v) }

func (c serverCodec) Unmarshal(data []byte, v any) error {
	if err := unmarshal(data, v); err != nil {
		return err
	}
	c.digests.Store(v, sha256.Sum256(data))
	return nil
}

// digestOf takes the digest of the bytes m was read from; ok is false if
// m was not read by the codec.
func (c serverCodec) digestOf(m any) (d [sha256.Size]byte, ok bool) {
	v, ok := c.digests.LoadAndDelete(m)
	if !ok {
		return d, false
	}
	return v.([sha256.Size]byte), true
}
