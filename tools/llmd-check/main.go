// Command llmd-check is llm-d's KV-cache indexer (github.com/llm-d/llm-d-kv-cache)
// wired as llm-d wires it, subscribed to kvtier's KV events, and driven by JSON
// lines on stdin. It exists so kvtier's tests can check that what kvtier
// publishes is understood by the real consumer, not by our reading of it: every
// decoding, key-derivation and indexing step below is the library's own code.
//
// Protocol (one JSON object per line in, one per line out; logs go to stderr):
//
//	{"op":"ping"}                                   -> {"ok":true}
//	{"op":"lookup","model":M,"tokens":[...]}        -> {"keys":n,"pods":{pod:{tier:k}},"leading":{pod:k},"held":{pod:{tier:[i...]}}}
//	{"op":"score","model":M,"tokens":[...],"pods":[...]} -> {"keys":n,"scores":{pod:s}}
//	{"op":"quit"}                                   -> exits 0 (so does end of input)
//
// A request that cannot be answered gets {"error":"..."}; the tool keeps going.
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strconv"
	"strings"
	"syscall"

	"go.uber.org/zap/zapcore"
	"k8s.io/apimachinery/pkg/util/sets"
	"sigs.k8s.io/controller-runtime/pkg/log"
	crzap "sigs.k8s.io/controller-runtime/pkg/log/zap"

	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvcache/kvblock"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents"
	"github.com/llm-d/llm-d-kv-cache/pkg/kvevents/engineadapter"
)

// listFlag collects a repeatable string flag (--endpoint, --tier-weight).
type listFlag []string

func (l *listFlag) String() string     { return strings.Join(*l, ",") }
func (l *listFlag) Set(v string) error { *l = append(*l, v); return nil }

// request is every op's input; fields an op does not use are ignored.
type request struct {
	Op     string   `json:"op"`
	Model  string   `json:"model"`
	Tokens []uint32 `json:"tokens"`
	// Pods restricts "score" to these pods (llm-d's own filter); empty = all.
	Pods []string `json:"pods"`
}

// lookupReply is what "lookup" answers. Pods is the per-tier leading run the
// brief asks for; Leading and Held are there so a test can tell apart "the
// index lost block i" from "the index never had the chain" (Lookup itself
// skips a missing key and goes on, see leadingRuns).
type lookupReply struct {
	Keys    int                         `json:"keys"`
	Pods    map[string]map[string]int   `json:"pods"`
	Leading map[string]int              `json:"leading"`
	Held    map[string]map[string][]int `json:"held"`
}

type scoreReply struct {
	Keys   int                `json:"keys"`
	Scores map[string]float64 `json:"scores"`
}

func main() {
	var endpoints, weights listFlag
	flag.Var(&endpoints, "endpoint", "ZMQ PUB endpoint to CONNECT a SUB socket to, e.g. tcp://127.0.0.1:5557 (repeatable: one per kvtier node)")
	blockSize := flag.Int("block-size", 16, "tokens per block; must equal the publisher's blocks (llm-d recomputes its keys from token_ids in chunks of this size)")
	topicFilter := flag.String("topic-filter", "kv@", "ZMQ subscription prefix")
	hashSeed := flag.String("hash-seed", "", "llm-d's TokenProcessorConfig.HashSeed (the PYTHONHASHSEED it is deployed with); any value works here since events and queries both go through this process")
	concurrency := flag.Int("concurrency", 4, "event pool workers (llm-d shards by pod, so one pod's events stay ordered)")
	verbosity := flag.Int("v", 0, "log verbosity: 4 shows llm-d's DEBUG lines (dropped events and why), 5 its TRACE lines")
	flag.Var(&weights, "tier-weight", "TIER=WEIGHT for llm-d's scorer, e.g. disk=0.5 (repeatable; overrides llm-d's defaults gpu=1.0 cpu=0.8; a tier with no weight scores 1.0)")
	flag.Parse()

	if len(endpoints) == 0 {
		fmt.Fprintln(os.Stderr, "llmd-check: at least one --endpoint is required")
		os.Exit(2)
	}
	if *blockSize <= 0 {
		fmt.Fprintln(os.Stderr, "llmd-check: --block-size must be > 0")
		os.Exit(2)
	}

	// controller-runtime's logger is the one llm-d logs through; without
	// SetLogger it would complain and drop every line. Logs go to stderr so
	// stdout stays one JSON reply per request.
	logger := crzap.New(crzap.WriteTo(os.Stderr), crzap.Level(zapcore.Level(-*verbosity)))
	log.SetLogger(logger)

	ctx, stop := signal.NotifyContext(log.IntoContext(context.Background(), logger), syscall.SIGINT, syscall.SIGTERM)
	defer stop()

	if err := run(ctx, endpoints, weights, *blockSize, *topicFilter, *hashSeed, *concurrency); err != nil {
		logger.Error(err, "llmd-check failed")
		os.Exit(1)
	}
}

// run wires llm-d the way its own examples/kv_events/online does: an Indexer
// (in-memory kvblock index + LongestPrefix scorer, no tokenizer), and an
// events Pool writing into the Indexer's index through the vLLM adapter, fed
// by one remote-mode ZMQ subscriber per endpoint.
func run(ctx context.Context, endpoints, weights []string, blockSize int, topicFilter, hashSeed string, concurrency int) error {
	logger := log.FromContext(ctx)

	cfg, err := kvcache.NewDefaultConfig()
	if err != nil {
		return err
	}
	if cfg.BackendConfigs, err = tierWeights(cfg.BackendConfigs, weights); err != nil {
		return err
	}

	// One token processor config for both sides: the pool derives request keys
	// from each BlockStored's token_ids, the indexer from the query's tokens;
	// they only meet if block size and seed agree.
	tpConfig := &kvblock.TokenProcessorConfig{BlockSizeTokens: blockSize, HashSeed: hashSeed}
	tokenProcessor, err := kvblock.NewChunkedTokenDatabase(tpConfig)
	if err != nil {
		return err
	}
	indexer, err := kvcache.NewKVCacheIndexer(ctx, cfg, tokenProcessor)
	if err != nil {
		return err
	}
	go indexer.Run(ctx) // no tokenizer pool configured: it only waits for ctx

	adapter, err := engineadapter.NewAdapter(engineadapter.EngineTypeVLLM)
	if err != nil {
		return err
	}
	poolTP, err := kvblock.NewChunkedTokenDatabase(tpConfig) // a separate instance, as the example has
	if err != nil {
		return err
	}
	pool := kvevents.NewPool(&kvevents.Config{TopicFilter: topicFilter, Concurrency: concurrency},
		indexer.KVBlockIndex(), poolTP, adapter)
	pool.Start(ctx)

	// SubscriberManager is how llm-d runs per-pod subscribers (its pod
	// reconciler calls EnsureSubscriber). remote=true makes the SUB socket
	// Dial (connect) rather than Listen (bind): kvtier binds its PUB socket.
	// The subscriber's own id is only a map key; the pod a block is
	// attributed to comes from each message's topic (kv@POD@MODEL).
	subs := kvevents.NewSubscriberManager(pool)
	for _, ep := range endpoints {
		if err := subs.EnsureSubscriber(ctx, ep, ep, topicFilter, true); err != nil {
			return fmt.Errorf("subscribe %s: %w", ep, err)
		}
	}
	logger.Info("llmd-check ready", "endpoints", endpoints, "blockSize", blockSize, "topicFilter", topicFilter)

	serve(ctx, indexer)

	subs.Shutdown(ctx)
	pool.Shutdown(ctx)
	return nil
}

// serve answers stdin's requests until "quit", end of input or a signal.
func serve(ctx context.Context, indexer *kvcache.Indexer) {
	lines := make(chan []byte)
	go func() {
		defer close(lines)
		in := bufio.NewScanner(os.Stdin)
		in.Buffer(make([]byte, 1<<20), 64<<20) // long prompts: a line can be MBs of token ids
		for in.Scan() {
			lines <- append([]byte(nil), in.Bytes()...)
		}
	}()
	out := json.NewEncoder(os.Stdout) // Encode writes one line per call: the reader can block on readline
	for {
		var line []byte
		var ok bool
		select {
		case <-ctx.Done():
			return
		case line, ok = <-lines:
			if !ok {
				return
			}
		}
		if len(strings.TrimSpace(string(line))) == 0 {
			continue
		}
		var req request
		if err := json.Unmarshal(line, &req); err != nil {
			_ = out.Encode(map[string]string{"error": "bad request: " + err.Error()})
			continue
		}
		if req.Op == "quit" {
			return
		}
		reply, err := answer(ctx, indexer, &req)
		if err != nil {
			_ = out.Encode(map[string]string{"error": err.Error()})
			continue
		}
		_ = out.Encode(reply)
	}
}

func answer(ctx context.Context, indexer *kvcache.Indexer, req *request) (any, error) {
	switch req.Op {
	case "ping":
		return map[string]bool{"ok": true}, nil
	case "lookup":
		return lookup(ctx, indexer, req.Model, req.Tokens)
	case "score":
		// llm-d's own answer to "which pod should serve this prompt": the
		// LongestPrefix scorer over the same Lookup, tier weights applied.
		keys, err := indexer.ComputeBlockKeysFromTokens(ctx, req.Tokens, req.Model, nil)
		if err != nil {
			return nil, err
		}
		scores, err := indexer.ScoreTokens(ctx, req.Tokens, req.Model, req.Pods, nil)
		if err != nil {
			return nil, err
		}
		if scores == nil {
			scores = map[string]float64{}
		}
		return scoreReply{Keys: len(keys), Scores: scores}, nil
	default:
		return nil, fmt.Errorf("unknown op %q (ping, lookup, score, quit)", req.Op)
	}
}

// lookup computes the prompt's request keys with llm-d's token processor (the
// keys its scorer would look up), asks the index which pods hold each, and
// reduces that to leading runs.
func lookup(ctx context.Context, indexer *kvcache.Indexer, model string, tokens []uint32) (*lookupReply, error) {
	reply := &lookupReply{Pods: map[string]map[string]int{}, Leading: map[string]int{}, Held: map[string]map[string][]int{}}
	keys, err := indexer.ComputeBlockKeysFromTokens(ctx, tokens, model, nil)
	if err != nil {
		return nil, err
	}
	reply.Keys = len(keys)
	if len(keys) == 0 {
		return reply, nil // fewer tokens than a block: Lookup would refuse an empty key list
	}
	// An empty pod set means "every pod" to the index.
	keyToPods, err := indexer.KVBlockIndex().Lookup(ctx, keys, sets.New[string]())
	if err != nil {
		return nil, err
	}
	leadingRuns(keys, keyToPods, reply)
	return reply, nil
}

// leadingRuns fills reply from the index's answer. The in-memory index's
// Lookup does NOT stop at the first key nobody holds (a key absent from the
// index is skipped, only a key present with no pods ends the scan), so a block
// removed from the middle of a chain leaves the blocks after it visible; what
// a router can use is the run from block 0, which is what is counted here
// (llm-d's LongestPrefix scorer counts the same way, per pod).
func leadingRuns(keys []kvblock.BlockHash, keyToPods map[kvblock.BlockHash][]kvblock.PodEntry, reply *lookupReply) {
	type podTier struct{ pod, tier string }
	run := map[podTier]int{}
	anyRun := map[string]int{}
	for i, key := range keys {
		podsHere := map[string]bool{}
		seen := map[podTier]bool{} // a pod can appear twice per tier (HMA groups): count once
		for _, e := range keyToPods[key] {
			pt := podTier{e.PodIdentifier, e.DeviceTier}
			if seen[pt] {
				continue
			}
			seen[pt] = true
			podsHere[e.PodIdentifier] = true
			if reply.Held[pt.pod] == nil {
				reply.Held[pt.pod] = map[string][]int{}
				reply.Pods[pt.pod] = map[string]int{}
			}
			reply.Held[pt.pod][pt.tier] = append(reply.Held[pt.pod][pt.tier], i)
			if run[pt] == i { // held blocks 0..i-1 in this tier, and block i too
				run[pt] = i + 1
			}
			reply.Pods[pt.pod][pt.tier] = run[pt]
		}
		for pod := range podsHere {
			if anyRun[pod] == i {
				anyRun[pod] = i + 1
			}
		}
	}
	for pod := range reply.Pods {
		reply.Leading[pod] = anyRun[pod]
	}
}

// tierWeights applies --tier-weight TIER=W over llm-d's default backend weights.
func tierWeights(defaults []*kvcache.KVCacheBackendConfig, overrides []string) ([]*kvcache.KVCacheBackendConfig, error) {
	byName := map[string]float64{}
	for _, b := range defaults {
		byName[b.Name] = b.Weight
	}
	for _, o := range overrides {
		name, value, ok := strings.Cut(o, "=")
		w, err := strconv.ParseFloat(value, 64)
		if !ok || name == "" || err != nil {
			return nil, fmt.Errorf("--tier-weight %q: want TIER=WEIGHT, e.g. disk=0.5", o)
		}
		// llm-d lowercases an event's medium before indexing it, so a weight
		// only ever matches a lowercase tier name.
		byName[strings.ToLower(name)] = w
	}
	names := make([]string, 0, len(byName))
	for n := range byName {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]*kvcache.KVCacheBackendConfig, 0, len(names))
	for _, n := range names {
		out = append(out, &kvcache.KVCacheBackendConfig{Name: n, Weight: byName[n]})
	}
	return out, nil
}
