# Sourced by the experiments' scripts: what a CORPUS argument names.
#   corpus_path CORPUS   prints the text file: a public corpus by name (tinyshakespeare: downloaded once
#                        into experiments/data/, checked by its SHA-256) or a file of yours (FILE.txt)
#   corpus_usage SCRIPT SHAPE   prints the usage line of SCRIPT (its arguments: SHAPE) and the corpora, exit 2
corpus_path() {
  case "$1" in
    */*|*.txt|*.jsonl|*.json|*.parquet)
      [ -f "$1" ] || { echo "run.sh: error: corpus $1 does not exist: give a text file, or a corpus by name" \
        "(tinyshakespeare)" >&2; exit 2; }
      realpath "$1" ;;
    *) python -m mcsd.commands.download "$1" to="$(dirname "${BASH_SOURCE[0]}")/data" ;;
  esac
}
corpus_usage() {
  echo "usage: $1 $2" >&2
  echo "  CORPUS: tinyshakespeare (downloaded once into experiments/data/), embedded where the experiment" \
    "allows it (Python's own documentation, no download), or a .txt file of yours" >&2
  exit 2
}
