# Sourced by the before/after experiments (with `here` set to the experiment's folder):
#   code_of SIDE COMMIT   prints the code a side runs, to put on PYTHONPATH: `before`, a worktree of
#                         COMMIT in /tmp (made once); `after`, this checkout.
code_of() {
  if [ "$1" = after ]; then git -C "$here" rev-parse --show-toplevel; return; fi
  local tree="/tmp/mcsd_before_$2"
  [ -d "$tree" ] || git -C "$here" worktree add -q "$tree" "$2"
  echo "$tree"
}
