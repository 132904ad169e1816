// avroread reads Kafka topics written in the Confluent wire format and prints every message as one JSON line:
//
//	{"topic": ..., "partition": ..., "offset": ..., "key": ..., "value": ..., "headers": [...],
//	 "key_schema_id": ..., "value_schema_id": ...}
//
// It reads each topic from its first offset to the end it had when avroread started (read_committed: records of
// aborted or still open Kafka transactions are never printed), resolves the schema id of
// every key and value through a Confluent-compatible registry (GET /schemas/ids/{id}) and decodes the Avro body
// with github.com/hamba/avro/v2. It shares no code with cdcd: it is the independent check of cdcd's output.
//
// Usage:
//
//	avroread [-bootstrap-servers HOST:PORT] [-registry-url URL] [-regex PATTERN] [-timeout 5m]
//	         [-avro-header NAME]... [TOPIC...]
//
// -bootstrap-servers and -registry-url default to $CDCD_KAFKA__BOOTSTRAP_SERVERS and $CDCD_SCHEMA_REGISTRY__URL.
// Topics are those named plus those matching -regex (an RE2 pattern matched against the whole name).
// A null key or value (a tombstone) prints as null; a message whose bytes are not the Confluent wire format
// (magic byte 0, 4-byte schema id) or whose schema id the registry does not know stops avroread with an error
// naming the topic, partition and offset. Header values print as base64, or decoded like keys and values for
// the headers named with -avro-header (Debezium's __debezium.oldkey / __debezium.newkey).
// Exit status: 0 done, 1 a runtime error, 2 bad arguments.
//
// How Avro values print as JSON is described in tojson.go.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kadm"
	"github.com/twmb/franz-go/pkg/kgo"
)

type usageError struct{ msg string }

func (e usageError) Error() string { return e.msg }

type options struct {
	brokers  string
	registry string
	pattern  *regexp.Regexp
	regex    string
	topics   []string
	timeout  time.Duration
	headers  []string
}

type names []string

func (n *names) String() string     { return strings.Join(*n, ",") }
func (n *names) Set(v string) error { *n = append(*n, v); return nil }

func parseArgs(args []string) (options, error) {
	fs := flag.NewFlagSet("avroread", flag.ContinueOnError)
	brokers := fs.String("bootstrap-servers", os.Getenv("CDCD_KAFKA__BOOTSTRAP_SERVERS"), "Kafka bootstrap servers")
	registry := fs.String("registry-url", os.Getenv("CDCD_SCHEMA_REGISTRY__URL"), "Confluent-compatible registry URL")
	regex := fs.String("regex", "", "also read every topic whose whole name matches this RE2 pattern")
	timeout := fs.Duration("timeout", 5*time.Minute, "give up when the topics are not read to their end by then")
	var headers names
	fs.Var(&headers, "avro-header", "decode this header's value as Confluent-framed Avro, e.g. __debezium.oldkey (repeatable)")
	if err := fs.Parse(args); err != nil {
		return options{}, usageError{err.Error()}
	}
	opts := options{brokers: *brokers, registry: *registry, topics: fs.Args(), timeout: *timeout, headers: headers}
	if opts.brokers == "" {
		return opts, usageError{"no Kafka: give -bootstrap-servers or set CDCD_KAFKA__BOOTSTRAP_SERVERS"}
	}
	if opts.registry == "" {
		return opts, usageError{"no registry: give -registry-url or set CDCD_SCHEMA_REGISTRY__URL"}
	}
	if *regex != "" {
		re, err := regexp.Compile("^(?:" + *regex + ")$")
		if err != nil {
			return opts, usageError{fmt.Sprintf("-regex %q: %v", *regex, err)}
		}
		opts.pattern, opts.regex = re, *regex
	}
	if opts.pattern == nil && len(opts.topics) == 0 {
		return opts, usageError{"no topics: name them or give -regex"}
	}
	return opts, nil
}

func main() {
	opts, err := parseArgs(os.Args[1:])
	if err != nil {
		fmt.Fprintln(os.Stderr, "avroread:", err)
		os.Exit(2)
	}
	if err := run(opts); err != nil {
		fmt.Fprintln(os.Stderr, "avroread:", err)
		var usage usageError
		if errors.As(err, &usage) {
			os.Exit(2)
		}
		os.Exit(1)
	}
}

func run(opts options) error {
	ctx, cancel := context.WithTimeout(context.Background(), opts.timeout)
	defer cancel()
	// read_committed: never the records of an aborted or open Kafka transaction (cdcd's exactly-once delivery);
	// the transactions' commit and abort markers are kept only to see where each partition ends.
	client, err := kgo.NewClient(
		kgo.SeedBrokers(opts.brokers),
		kgo.FetchIsolationLevel(kgo.ReadCommitted()),
		kgo.KeepControlRecords(),
	)
	if err != nil {
		return usageError{fmt.Sprintf("-bootstrap-servers %q: %v", opts.brokers, err)}
	}
	defer client.Close()
	topics, err := selectTopics(ctx, kadm.NewClient(client), opts)
	if err != nil {
		return err
	}
	ranges, err := offsetRanges(ctx, kadm.NewClient(client), topics)
	if err != nil {
		return err
	}
	decoder, err := newDecoder(opts.registry, opts.headers)
	if err != nil {
		return usageError{fmt.Sprintf("-registry-url %q: %v", opts.registry, err)}
	}
	out := bufio.NewWriter(os.Stdout)
	defer out.Flush()
	return consume(ctx, client, ranges, decoder, out)
}

// selectTopics: the named topics (each must exist) and the existing topics matching the pattern, sorted.
func selectTopics(ctx context.Context, adm *kadm.Client, opts options) ([]string, error) {
	all, err := adm.ListTopics(ctx)
	if err != nil {
		return nil, fmt.Errorf("listing topics: %w", err)
	}
	var topics []string
	for _, name := range opts.topics {
		if !all.Has(name) {
			return nil, fmt.Errorf("topic %q does not exist", name)
		}
		topics = append(topics, name)
	}
	if opts.pattern != nil {
		for _, name := range all.Names() {
			if opts.pattern.MatchString(name) && !slices.Contains(topics, name) {
				topics = append(topics, name)
			}
		}
		if len(topics) == 0 {
			return nil, fmt.Errorf("no topic matches -regex %q", opts.regex)
		}
	}
	slices.Sort(topics)
	return topics, nil
}

type span struct{ start, end int64 } // offsets [start, end) to read

// offsetRanges: per topic and partition, from the log start offset to the last stable offset at this moment.
func offsetRanges(ctx context.Context, adm *kadm.Client, topics []string) (map[string]map[int32]span, error) {
	starts, err := adm.ListStartOffsets(ctx, topics...)
	if err == nil {
		err = starts.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing start offsets: %w", err)
	}
	ends, err := adm.ListCommittedOffsets(ctx, topics...) // the last stable offset: read_committed's end
	if err == nil {
		err = ends.Error()
	}
	if err != nil {
		return nil, fmt.Errorf("listing end offsets: %w", err)
	}
	ranges := map[string]map[int32]span{}
	ends.Each(func(end kadm.ListedOffset) {
		start, _ := starts.Lookup(end.Topic, end.Partition)
		if end.Offset > start.Offset {
			if ranges[end.Topic] == nil {
				ranges[end.Topic] = map[int32]span{}
			}
			ranges[end.Topic][end.Partition] = span{start.Offset, end.Offset}
		}
	})
	return ranges, nil
}

func consume(ctx context.Context, client *kgo.Client, ranges map[string]map[int32]span, dec *decoder, out *bufio.Writer) error {
	assign := map[string]map[int32]kgo.Offset{}
	remaining := 0
	for topic, parts := range ranges {
		assign[topic] = map[int32]kgo.Offset{}
		for p, s := range parts {
			assign[topic][p] = kgo.NewOffset().At(s.start)
			remaining++
		}
	}
	if remaining == 0 {
		return nil
	}
	client.AddConsumePartitions(assign)
	for remaining > 0 {
		fetches := client.PollFetches(ctx)
		if ctx.Err() != nil {
			return fmt.Errorf("%d partitions not read to their end in time (-timeout): %w", remaining, ctx.Err())
		}
		if err := fetches.Err(); err != nil {
			return fmt.Errorf("fetching: %w", err)
		}
		var failed error
		fetches.EachRecord(func(r *kgo.Record) {
			s, ok := ranges[r.Topic][r.Partition]
			if failed != nil || !ok || r.Offset >= s.end {
				return // read past the end avroread started with
			}
			if !r.Attrs.IsControl() {
				line, err := dec.message(ctx, r)
				if err != nil {
					failed = fmt.Errorf("topic %s partition %d offset %d: %w", r.Topic, r.Partition, r.Offset, err)
					return
				}
				out.Write(line)
				out.WriteByte('\n')
			}
			if r.Offset+1 >= s.end {
				remaining--
			}
		})
		if failed != nil {
			return failed
		}
	}
	return nil
}
