"""Prometheus metric names the runtime exposes and the gateway reads: vLLM's, so dashboards, KEDA rules and
the Gateway API inference extension that read vLLM work unchanged.

Counters are exposed with prometheus_client's `_total` suffix (vllm:prompt_tokens_total), as vLLM's are.
"""

from __future__ import annotations

NUM_REQUESTS_RUNNING = "vllm:num_requests_running"
NUM_REQUESTS_WAITING = "vllm:num_requests_waiting"
KV_CACHE_USAGE = "vllm:kv_cache_usage_perc"
PREFIX_CACHE_QUERIES = "vllm:prefix_cache_queries"
PREFIX_CACHE_HITS = "vllm:prefix_cache_hits"
NUM_PREEMPTIONS = "vllm:num_preemptions"
PROMPT_TOKENS = "vllm:prompt_tokens"
GENERATION_TOKENS = "vllm:generation_tokens"
REQUEST_SUCCESS = "vllm:request_success"
TIME_TO_FIRST_TOKEN = "vllm:time_to_first_token_seconds"
INTER_TOKEN_LATENCY = "vllm:inter_token_latency_seconds"
E2E_REQUEST_LATENCY = "vllm:e2e_request_latency_seconds"
REQUEST_QUEUE_TIME = "vllm:request_queue_time_seconds"
CACHE_CONFIG_INFO = "vllm:cache_config_info"
SPEC_DECODE_NUM_DRAFTS = "vllm:spec_decode_num_drafts"
SPEC_DECODE_NUM_DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS = "vllm:spec_decode_num_accepted_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS = "vllm:spec_decode_num_accepted_tokens_per_pos"
MODEL_NAME_LABEL = "model_name"
POSITION_LABEL = "position"  # draft position of vllm:spec_decode_num_accepted_tokens_per_pos
