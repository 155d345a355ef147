# Sourced by an experiment's run.sh (with `here` set to its folder): reads `[--replace] [CORPUS.txt]`
# from the front of the script's arguments, shifting them, and sets
#   replace  (--replace) or nothing, to pass on to sweep.sh;
#   results  the experiment's folder (committed results) with --replace, else its trial/ folder;
#   corpus, name  the corpus (default: ../shared/data/tinyshakespeare.txt) and its name;
#   split    the corpus split by lines (split/train.txt, split/held_out.txt: split_corpus.sh).
replace=(); results="$here/trial"
if [ "${1:-}" = --replace ]; then replace=(--replace); results="$here"; shift; fi
corpus="${1:-$here/../../../shared/data/tinyshakespeare.txt}"; shift $(( $# < 1 ? $# : 1 ))
name="$(basename "${corpus%.*}")"
split="$here/logs/$name/split"; "$here/../split_corpus.sh" "$corpus" "$split"
