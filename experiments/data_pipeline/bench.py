"""Measurements of the data pipeline, each in a fresh process, each writing RESULTS/<name>.json.

    python bench.py build NAME CORPUS_DIR CACHE [--num-proc N]
        LanguageModelDataModule.build() of data=text_files on CORPUS_DIR/*.jsonl: the BPE on its
        sample, then the token shards; wall time of each phase, tokens, peak memory of this
        process and of its tokenizing workers (VmHWM).
    python bench.py encode_batch NAME CORPUS_DIR TOKENIZER --threads N [--fast]
        tokenizers' own Tokenizer.encode_batch (--fast: encode_batch_fast, no offsets, what the
        build calls) on the same documents (read in batches of 1000 as the build reads them), N
        Rayon threads: the time spent in encode_batch alone.
    python bench.py datasets_map NAME CORPUS_DIR TOKENIZER --num-proc N
        the alternative we measured against: datasets.load_dataset (an Arrow copy of the corpus)
        then Dataset.map(num_proc=N) encoding each batch; wall time, tokens/s, bytes written.
    python bench.py loading NAME CACHE CORPUS_DIR --batches N
        seconds per batch drawn from the shard-backed train loader (size=small's batch).
"""
import argparse
import json
import os
import resource
import sys
import time
from pathlib import Path

RESULTS = Path(os.environ.get("RESULTS", Path(__file__).parent / "results"))


def vm_hwm() -> int:
    """This process's peak resident memory in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM")


class PssSampler:
    """The peak, over time, of the proportional set size (PSS) of this process and its children
    summed: their memory without counting pages they share (forked workers) twice. Read from
    /proc/<pid>/smaps_rollup once a second (cheap next to the build it watches)."""

    def __init__(self, interval: float = 1.0) -> None:
        import threading

        self.peak, self.stop = 0, threading.Event()
        self.thread = threading.Thread(target=self._run, args=(interval,), daemon=True)
        self.thread.start()

    @staticmethod
    def _pss(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
        except OSError:
            pass
        return 0

    def _run(self, interval: float) -> None:
        me = os.getpid()
        while not self.stop.wait(interval):
            children = {pid for task in Path(f"/proc/{me}/task").iterdir() for pid in
                        (task / "children").read_text().split() if (task / "children").exists()}
            self.peak = max(self.peak, self._pss(me) + sum(self._pss(int(pid)) for pid in children))

    def close(self) -> int:
        self.stop.set()
        self.thread.join()
        return self.peak


def data_module(corpus: Path, cache: Path, **options):
    from mcsd.data import LanguageModelDataModule

    return LanguageModelDataModule(source="text_files", paths=sorted(str(path) for path in corpus.glob("*.jsonl")),
                                   cache_dir=str(cache), vocab_size=4096, seq_len=256, **options)


def build(args: argparse.Namespace) -> dict:
    from mcsd.data import tokens

    phases = {}
    build_store = tokens.build_store

    def timed_build_store(*positional, **named):  # the shard phase, apart from the BPE's
        start = time.perf_counter()
        store = build_store(*positional, **named)
        phases["shards_seconds"] = time.perf_counter() - start
        return store

    tokens.build_store = timed_build_store  # what open_or_build calls
    sampler = PssSampler()
    start = time.perf_counter()
    data = data_module(args.corpus, args.cache, num_proc=args.num_proc)
    splits = data.build()
    total = time.perf_counter() - start
    peak_pss = sampler.close()
    store = splits["train"].store
    text_bytes = sum(path.stat().st_size for path in args.corpus.glob("*.jsonl"))
    return {"corpus_file_bytes": text_bytes, "documents": store.documents, "tokens": store.tokens,
            "num_proc": args.num_proc, "total_seconds": total, **phases,
            "tokens_per_second": store.tokens / phases["shards_seconds"],
            "peak_main_bytes": vm_hwm(), "peak_pss_all_processes_bytes": peak_pss,
            "peak_worker_bytes": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
            "shard_bytes": sum(path.stat().st_size for path in store.folder.glob("*.bin"))}


def encode_batch(args: argparse.Namespace) -> dict:
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before tokenizers starts its thread pool
    os.environ["TOKENIZERS_PARALLELISM"] = "true"
    from tokenizers import Tokenizer

    from mcsd.data.corpus import text_files

    tokenizer = Tokenizer.from_file(str(args.tokenizer))
    source = text_files(sorted(str(path) for path in args.corpus.glob("*.jsonl")), "text", "document",
                        Path("/tmp/hf-bench"))["train"]
    spent, count = 0.0, 0
    encode = tokenizer.encode_batch_fast if args.fast else tokenizer.encode_batch
    for texts in source.documents(1000):
        start = time.perf_counter()
        encodings = encode(texts)
        spent += time.perf_counter() - start
        count += sum(len(encoding.ids) for encoding in encodings)
    return {"threads": args.threads, "fast": args.fast, "tokens": count, "encode_seconds": spent, "tokens_per_second": count / spent}


def datasets_map(args: argparse.Namespace) -> dict:
    import shutil

    import datasets
    from tokenizers import Tokenizer

    cache = Path("/tmp/hf-bench-map")
    shutil.rmtree(cache, ignore_errors=True)
    start = time.perf_counter()
    corpus = datasets.load_dataset("json", data_files=sorted(str(path) for path in args.corpus.glob("*.jsonl")),
                                   split="train", cache_dir=str(cache))
    loaded = time.perf_counter()
    tokenizer = Tokenizer.from_file(str(args.tokenizer))

    def encode(batch: dict) -> dict:
        return {"ids": [encoding.ids for encoding in tokenizer.encode_batch_fast(batch["text"])]}

    tokens = corpus.map(encode, batched=True, num_proc=args.num_proc, remove_columns=["text"])
    done = time.perf_counter()
    count = sum(len(ids) for batch in tokens.iter(batch_size=10000) for ids in batch["ids"])
    written = sum(path.stat().st_size for path in cache.rglob("*") if path.is_file())
    shutil.rmtree(cache, ignore_errors=True)
    return {"num_proc": args.num_proc, "tokens": count, "load_seconds": loaded - start, "map_seconds": done - loaded,
            "tokens_per_second": count / (done - start), "map_tokens_per_second": count / (done - loaded),
            "bytes_written": written}


def loading(args: argparse.Namespace) -> dict:
    data = data_module(args.corpus, args.cache, batch_size=16)
    data.build()
    loader = data.train_dataloader()
    iterator = iter(loader)
    next(iterator)  # the first batch opens the shards
    start = time.perf_counter()
    for _ in range(args.batches):
        next(iterator)
    seconds = (time.perf_counter() - start) / args.batches
    return {"batches": args.batches, "batch_size": 16, "seconds_per_batch": seconds}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    one = sub.add_parser("build")
    one.add_argument("name")
    one.add_argument("corpus", type=Path)
    one.add_argument("cache", type=Path)
    one.add_argument("--num-proc", type=int, default=2)
    two = sub.add_parser("encode_batch")
    two.add_argument("name")
    two.add_argument("corpus", type=Path)
    two.add_argument("tokenizer", type=Path)
    two.add_argument("--threads", type=int, default=2)
    two.add_argument("--fast", action="store_true")
    four = sub.add_parser("datasets_map")
    four.add_argument("name")
    four.add_argument("corpus", type=Path)
    four.add_argument("tokenizer", type=Path)
    four.add_argument("--num-proc", type=int, default=2)
    three = sub.add_parser("loading")
    three.add_argument("name")
    three.add_argument("cache", type=Path)
    three.add_argument("corpus", type=Path)
    three.add_argument("--batches", type=int, default=500)
    args = parser.parse_args()
    result = {"command": " ".join(sys.argv[1:]), **globals()[args.command](args)}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"{args.name}.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
