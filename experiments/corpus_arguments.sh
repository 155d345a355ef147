# Sourced by an experiment's run.sh (with `here` set to its folder): reads `[--replace|--add] [CORPUS.txt]`
# from the front of the script's arguments, shifting them, and sets
#   results_mode  (--replace) or (--add) or nothing, to pass on to sweep.sh;
#   results  the experiment's folder (committed results) with --replace or --add, else its trial/ folder;
#   corpus, name  the corpus (default: ../shared/data/tinyshakespeare.txt) and its name;
#   split    the corpus split by lines (split/train.txt, split/held_out.txt: split_corpus.sh).
results_mode=(); results="$here/trial"
if [ "${1:-}" = --replace ] || [ "${1:-}" = --add ]; then results_mode=("$1"); results="$here"; shift; fi
corpus="${1:-$here/../../../shared/data/tinyshakespeare.txt}"; shift $(( $# < 1 ? $# : 1 ))
name="$(basename "${corpus%.*}")"
split="$here/logs/$name/split"; "$here/../split_corpus.sh" "$corpus" "$split"
