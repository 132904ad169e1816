package main

// How decoded Avro values print as JSON. hamba/avro's generic reader (Reader.ReadNext) decodes into Go values:
// records and maps as map[string]any, a union's non-null value as a one-entry map from the branch's name,
// date and timestamp-* as time.Time, time-* as time.Duration, decimals as *big.Rat, local-timestamp-* as the
// number. toJSON walks them together with their schema:
//
//	null, boolean, string, enum  JSON null, true/false, string
//	int, long                    number (exact: JSON integers of any size)
//	float, double                number with a fraction or exponent (1.0, never 1), the shortest form that reads
//	                             back as the same double; a float is widened to double exactly (1.1f prints
//	                             1.100000023841858); NaN, Infinity, -Infinity as those strings
//	bytes, fixed                 string, standard base64 with padding
//	decimal (bytes or fixed)     string, plain notation with exactly `scale` fraction digits: "-12.30"
//	uuid                         string, as written
//	date                         "YYYY-MM-DD"
//	time-millis, time-micros     "HH:MM:SS.ffffff"
//	timestamp-millis/-micros     "YYYY-MM-DDTHH:MM:SS.ffffffZ" (UTC)
//	local-timestamp-millis/-micros  "YYYY-MM-DDTHH:MM:SS.ffffff" (no zone)
//	record                       object, fields in schema order
//	array, map                   array, object
//	union                        the value of the branch written (null for null); the branch is not named
//
// A Go value that does not fit its schema is an error, never printed as something else.

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/hamba/avro/v2"
)

// object is a JSON object that keeps its keys in the order given.
type object struct {
	keys   []string
	values []any
}

func (o object) MarshalJSON() ([]byte, error) {
	var buf bytes.Buffer
	buf.WriteByte('{')
	for i, k := range o.keys {
		if i > 0 {
			buf.WriteByte(',')
		}
		key, _ := marshal(k)
		value, err := marshal(o.values[i])
		if err != nil {
			return nil, err
		}
		buf.Write(key)
		buf.WriteByte(':')
		buf.Write(value)
	}
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// marshal is json.Marshal without HTML escaping: "<a/>" prints as is, not as "\u003ca/\u003e".
func marshal(v any) ([]byte, error) {
	var buf bytes.Buffer
	encoder := json.NewEncoder(&buf)
	encoder.SetEscapeHTML(false)
	if err := encoder.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n")), nil
}

func mismatch(schema avro.Schema, v any) error {
	return fmt.Errorf("decoded %T for Avro type %s", v, schema.Type())
}

func logicalType(schema avro.Schema) avro.LogicalType {
	if s, ok := schema.(avro.LogicalTypeSchema); ok && s.Logical() != nil {
		return s.Logical().Type()
	}
	return ""
}

func toJSON(schema avro.Schema, v any) (any, error) {
	switch s := schema.(type) {
	case *avro.RefSchema:
		return toJSON(s.Schema(), v)
	case *avro.NullSchema:
		if v != nil {
			return nil, mismatch(schema, v)
		}
		return nil, nil
	case *avro.UnionSchema:
		return unionJSON(s, v)
	case *avro.RecordSchema:
		return recordJSON(s, v)
	case *avro.ArraySchema:
		items, ok := v.([]any)
		if !ok {
			return nil, mismatch(schema, v)
		}
		out := make([]any, len(items))
		for i, item := range items {
			var err error
			if out[i], err = toJSON(s.Items(), item); err != nil {
				return nil, fmt.Errorf("[%d]: %w", i, err)
			}
		}
		return out, nil
	case *avro.MapSchema:
		entries, ok := v.(map[string]any)
		if !ok {
			return nil, mismatch(schema, v)
		}
		out := make(map[string]any, len(entries))
		for k, entry := range entries {
			var err error
			if out[k], err = toJSON(s.Values(), entry); err != nil {
				return nil, fmt.Errorf("[%q]: %w", k, err)
			}
		}
		return out, nil
	case *avro.FixedSchema:
		return bytesJSON(schema, v)
	case *avro.PrimitiveSchema:
		return primitiveJSON(s, v)
	case *avro.EnumSchema:
		if _, ok := v.(string); !ok {
			return nil, mismatch(schema, v)
		}
		return v, nil
	}
	return nil, fmt.Errorf("unsupported Avro type %s", schema.Type())
}

func unionJSON(s *avro.UnionSchema, v any) (any, error) {
	if v == nil {
		if _, index := s.Types().Get(string(avro.Null)); index < 0 {
			return nil, fmt.Errorf("null for a union without null")
		}
		return nil, nil
	}
	entry, ok := v.(map[string]any)
	if !ok || len(entry) != 1 {
		return nil, mismatch(s, v)
	}
	for name, value := range entry {
		branch, _ := s.Types().Get(name)
		if branch == nil {
			return nil, fmt.Errorf("union has no branch %q", name)
		}
		return toJSON(branch, value)
	}
	panic("unreachable")
}

func recordJSON(s *avro.RecordSchema, v any) (any, error) {
	fields, ok := v.(map[string]any)
	if !ok || len(fields) != len(s.Fields()) {
		return nil, mismatch(s, v)
	}
	out := object{}
	for _, f := range s.Fields() {
		value, present := fields[f.Name()]
		if !present {
			return nil, fmt.Errorf("field %s missing", f.Name())
		}
		converted, err := toJSON(f.Type(), value)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", f.Name(), err)
		}
		out.keys = append(out.keys, f.Name())
		out.values = append(out.values, converted)
	}
	return out, nil
}

func primitiveJSON(s *avro.PrimitiveSchema, v any) (any, error) {
	var ok bool
	var out any
	switch s.Type() {
	case avro.Boolean:
		out = v
		_, ok = v.(bool)
	case avro.String:
		out = v
		_, ok = v.(string)
	case avro.Int, avro.Long:
		out, ok = integerJSON(logicalType(s), v)
	case avro.Float:
		var f float32
		if f, ok = v.(float32); ok {
			out = floatJSON(float64(f))
		}
	case avro.Double:
		var f float64
		if f, ok = v.(float64); ok {
			out = floatJSON(f)
		}
	case avro.Bytes:
		return bytesJSON(s, v)
	}
	if !ok {
		return nil, mismatch(s, v)
	}
	return out, nil
}

func integerJSON(logical avro.LogicalType, v any) (any, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), logical == ""
	case int64: // hamba's generic reader leaves local timestamps as numbers
		switch logical {
		case "":
			return x, true
		case avro.LocalTimestampMillis:
			return time.UnixMilli(x).UTC().Format("2006-01-02T15:04:05.000000"), true
		case avro.LocalTimestampMicros:
			return time.UnixMicro(x).UTC().Format("2006-01-02T15:04:05.000000"), true
		}
	case time.Duration:
		return clock(x), logical == avro.TimeMillis || logical == avro.TimeMicros
	case time.Time:
		switch logical {
		case avro.Date:
			return x.UTC().Format("2006-01-02"), true
		case avro.TimestampMillis, avro.TimestampMicros:
			return x.UTC().Format("2006-01-02T15:04:05.000000Z"), true
		}
	}
	return nil, false
}

func clock(d time.Duration) string {
	sign := ""
	if d < 0 {
		sign, d = "-", -d
	}
	us := d.Microseconds()
	return fmt.Sprintf("%s%02d:%02d:%02d.%06d", sign, us/3_600_000_000, us/60_000_000%60, us/1_000_000%60, us%1_000_000)
}

// floatJSON prints a float so that JSON readers see a float, never an integer: 1.0 prints 1.0, not 1.
func floatJSON(f float64) any {
	switch {
	case math.IsNaN(f):
		return "NaN"
	case math.IsInf(f, 1):
		return "Infinity"
	case math.IsInf(f, -1):
		return "-Infinity"
	}
	text := strconv.FormatFloat(f, 'g', -1, 64)
	if !strings.ContainsAny(text, ".e") {
		text += ".0"
	}
	return json.Number(text)
}

func bytesJSON(schema avro.Schema, v any) (any, error) {
	if rat, ok := v.(*big.Rat); ok {
		decimal, isDecimal := schema.(avro.LogicalTypeSchema).Logical().(*avro.DecimalLogicalSchema)
		if !isDecimal {
			return nil, mismatch(schema, v)
		}
		return rat.FloatString(decimal.Scale()), nil
	}
	if logicalType(schema) == avro.Decimal {
		return nil, mismatch(schema, v)
	}
	if b, ok := v.([]byte); ok {
		return base64.StdEncoding.EncodeToString(b), nil
	}
	if rv := reflect.ValueOf(v); rv.Kind() == reflect.Array && rv.Type().Elem().Kind() == reflect.Uint8 { // fixed
		b := make([]byte, rv.Len())
		reflect.Copy(reflect.ValueOf(b), rv)
		return base64.StdEncoding.EncodeToString(b), nil
	}
	return nil, mismatch(schema, v)
}
