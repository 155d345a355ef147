"""Cost benchmarks: inference memory/latency/throughput and training throughput."""
