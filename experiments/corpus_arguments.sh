# Sourced by an experiment's run.sh (with `here` set to its folder): reads `[--replace|--add] CORPUS`
# from the front of the script's arguments (CORPUS: tinyshakespeare, or a .txt file; none: the usage), shifting
# them, and sets
#   results_mode  (--replace) or (--add) or nothing, to pass on to sweep.sh;
#   results  the experiment's folder (committed results) with --replace or --add, else its trial/ folder;
#   corpus, name  the corpus's text file (a named one downloaded once into experiments/data/) and its name;
#   split    the corpus split by lines (split/train.txt, split/held_out.txt: split_corpus.sh).
results_mode=(); results="$here/trial"
if [ "${1:-}" = --replace ] || [ "${1:-}" = --add ]; then results_mode=("$1"); results="$here"; shift; fi
source "$here/../corpus_path.sh"
if [ -z "${1:-}" ] || [[ "$1" == *=* ]]; then  # no corpus, or an override in its place
  corpus_usage "experiments/$(basename "$here")/run.sh" "[--replace|--add] CORPUS [mcsd-train overrides...]"
fi
corpus="$(corpus_path "$1")"; shift
name="$(basename "${corpus%.*}")"
split="$here/logs/$name/split"; "$here/../split_corpus.sh" "$corpus" "$split"
