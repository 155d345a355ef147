# Sourced by the before/after experiments (with `here` set to the experiment's folder):
#   code_of SIDE COMMIT   prints the code a side runs, to put on PYTHONPATH: `before`, a worktree of
#                         COMMIT in /tmp (made once); `after`, this checkout.
code_of() {
  if [ "$1" = after ]; then git -C "$here" rev-parse --show-toplevel; return; fi
  local tree="/tmp/mcsd_before_$2"
  [ -d "$tree" ] || git -C "$here" worktree add -q "$tree" "$2"
  echo "$tree"
}
#   side_run SIDE COMMIT COMMAND...   runs COMMAND with that side's code on PYTHONPATH, from that code's
#                         folder: a bench's isolated points import from their working directory first
#                         where the side's own runner predates 2026-12-06 (Python 3.11's fork server), so
#                         from the checkout they would measure this checkout's code on both sides.
side_run() {
  local code
  code="$(code_of "$1" "$2")"
  shift 2
  (cd "$code" && PYTHONPATH="$code" "$@")
}
