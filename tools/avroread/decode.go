package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
)

// Kafka messages are bounded anyway: no limit of hamba's own on string and bytes lengths (default 1 MiB).
var avroAPI = avro.Config{MaxByteSliceSize: -1}.Freeze()

// decoder turns Kafka records into JSON lines, fetching each schema id from the registry once.
type decoder struct {
	registry    *sr.Client
	schemas     map[int]avro.Schema
	avroHeaders map[string]bool // headers whose values are Confluent-framed Avro, e.g. __debezium.oldkey
}

func newDecoder(url string, avroHeaders []string) (*decoder, error) {
	registry, err := sr.NewClient(sr.URLs(url))
	if err != nil {
		return nil, err
	}
	d := &decoder{registry: registry, schemas: map[int]avro.Schema{}, avroHeaders: map[string]bool{}}
	for _, name := range avroHeaders {
		d.avroHeaders[name] = true
	}
	return d, nil
}

type header struct {
	Key   string          `json:"key"`
	Value json.RawMessage `json:"value"` // base64, or decoded (-avro-header); null for a header without a value
}

type line struct {
	Topic         string          `json:"topic"`
	Partition     int32           `json:"partition"`
	Offset        int64           `json:"offset"`
	Key           json.RawMessage `json:"key"`
	Value         json.RawMessage `json:"value"`
	Headers       []header        `json:"headers"`
	KeySchemaID   *int            `json:"key_schema_id"`   // null for a null key
	ValueSchemaID *int            `json:"value_schema_id"` // null for a tombstone
}

func (d *decoder) message(ctx context.Context, r *kgo.Record) ([]byte, error) {
	out := line{Topic: r.Topic, Partition: r.Partition, Offset: r.Offset, Headers: []header{}}
	var err error
	if out.Key, out.KeySchemaID, err = d.field(ctx, r.Key); err != nil {
		return nil, fmt.Errorf("key: %w", err)
	}
	if out.Value, out.ValueSchemaID, err = d.field(ctx, r.Value); err != nil {
		return nil, fmt.Errorf("value: %w", err)
	}
	for _, h := range r.Headers {
		value, err := d.header(ctx, h.Key, h.Value)
		if err != nil {
			return nil, fmt.Errorf("header %s: %w", h.Key, err)
		}
		out.Headers = append(out.Headers, header{h.Key, value})
	}
	return marshal(out)
}

func (d *decoder) header(ctx context.Context, name string, raw []byte) (json.RawMessage, error) {
	if d.avroHeaders[name] {
		value, _, err := d.field(ctx, raw)
		return value, err
	}
	if raw == nil {
		return json.RawMessage("null"), nil
	}
	return marshal(base64.StdEncoding.EncodeToString(raw))
}

// field decodes a key or value: null stays null, anything else must be the Confluent wire format.
func (d *decoder) field(ctx context.Context, raw []byte) (json.RawMessage, *int, error) {
	if raw == nil {
		return json.RawMessage("null"), nil, nil
	}
	var wire sr.ConfluentHeader
	id, body, err := wire.DecodeID(raw)
	if err != nil {
		return nil, nil, fmt.Errorf("not the Confluent wire format (magic byte 0, 4-byte schema id): it starts % x",
			raw[:min(len(raw), 5)])
	}
	schema, err := d.schema(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	reader := avro.NewReader(nil, 0, avro.WithReaderConfig(avroAPI)).Reset(body)
	datum := reader.ReadNext(schema)
	if reader.Error != nil {
		return nil, nil, fmt.Errorf("schema id %d: cannot decode %d bytes: %w", id, len(body), reader.Error)
	}
	if reader.Peek(); reader.Error == nil {
		return nil, nil, fmt.Errorf("schema id %d: bytes left over after the datum (%d bytes in all)", id, len(body))
	}
	value, err := toJSON(schema, datum)
	if err != nil {
		return nil, nil, fmt.Errorf("schema id %d: %w", id, err)
	}
	encoded, err := marshal(value)
	return encoded, &id, err
}

func (d *decoder) schema(ctx context.Context, id int) (avro.Schema, error) {
	if s, ok := d.schemas[id]; ok {
		return s, nil
	}
	fetched, err := d.registry.SchemaByID(ctx, id)
	var response *sr.ResponseError
	if errors.As(err, &response) && response.StatusCode == http.StatusNotFound {
		return nil, fmt.Errorf("schema id %d is unknown to the registry: %s", id, response.Message)
	}
	if err != nil {
		return nil, fmt.Errorf("fetching schema id %d: %w", id, err)
	}
	if fetched.Type != sr.TypeAvro {
		return nil, fmt.Errorf("schema id %d is a %s schema, not Avro", id, fetched.Type)
	}
	// A cache per schema: versions of one table's schema reuse the same record names.
	parsed, err := avro.ParseWithCache(fetched.Schema, "", &avro.SchemaCache{})
	if err != nil {
		return nil, fmt.Errorf("schema id %d does not parse: %w", id, err)
	}
	d.schemas[id] = parsed
	return parsed, nil
}
