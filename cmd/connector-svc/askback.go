package main

import (
	"flag"
	"fmt"
)

// askBackConfig is how the service answers what MCP servers ask of it in
// the middle of a tool call: how long a user's input is waited for where
// the server waits on an open call, and the default sampling budgets of
// connectors that set none.
type askBackConfig struct {
	ElicitationTimeout string // parsed by read
	Sampling           samplingDefaults
}

// samplingDefaults are the budgets a connector's 0 means.
type samplingDefaults struct {
	MaxTokensPerRequest, MaxRequestsPerRun, MaxTokensPerRun, MaxRequestsPerMinute, MaxTokensPerMinute int
}

func askBackFlags(fs *flag.FlagSet, cfg *askBackConfig) {
	fs.StringVar(&cfg.ElicitationTimeout, "elicitation-timeout", "10m",
		"how long a server's request for a user's input waits on an open tool call before it is answered cancel; a transport's own "+
			"limit can be shorter: 28s on streamable HTTP (ELICITATION_TIMEOUT)")
	fs.IntVar(&cfg.Sampling.MaxTokensPerRequest, "sampling-max-tokens-per-request", 1024,
		"a sampling request's maxTokens is capped to this, for connectors that set none (SAMPLING_MAX_TOKENS_PER_REQUEST)")
	fs.IntVar(&cfg.Sampling.MaxRequestsPerRun, "sampling-max-requests-per-run", 10,
		"sampling requests served per query run or direct tool call, for connectors that set none (SAMPLING_MAX_REQUESTS_PER_RUN)")
	fs.IntVar(&cfg.Sampling.MaxTokensPerRun, "sampling-max-tokens-per-run", 16384,
		"sampling tokens per query run or direct tool call, for connectors that set none (SAMPLING_MAX_TOKENS_PER_RUN)")
	fs.IntVar(&cfg.Sampling.MaxRequestsPerMinute, "sampling-max-requests-per-minute", 60,
		"sampling requests per connector per minute over all replicas, for connectors that set none (SAMPLING_MAX_REQUESTS_PER_MINUTE)")
	fs.IntVar(&cfg.Sampling.MaxTokensPerMinute, "sampling-max-tokens-per-minute", 100000,
		"sampling tokens per connector per minute over all replicas, for connectors that set none (SAMPLING_MAX_TOKENS_PER_MINUTE)")
}

// check refuses budgets that could never serve a request.
func (d samplingDefaults) check() error {
	for _, v := range []struct {
		name string
		n    int
	}{
		{"SAMPLING_MAX_TOKENS_PER_REQUEST", d.MaxTokensPerRequest}, {"SAMPLING_MAX_REQUESTS_PER_RUN", d.MaxRequestsPerRun},
		{"SAMPLING_MAX_TOKENS_PER_RUN", d.MaxTokensPerRun}, {"SAMPLING_MAX_REQUESTS_PER_MINUTE", d.MaxRequestsPerMinute},
		{"SAMPLING_MAX_TOKENS_PER_MINUTE", d.MaxTokensPerMinute},
	} {
		if v.n <= 0 {
			return fmt.Errorf("%s %d: want a positive number", v.name, v.n)
		}
	}
	return nil
}
