# Sourced by the scripts that run on the GPU machine (gpu_checklist.sh, h200_wheel_check.sh), which
# set $out (the log folder) and $summary (its one-line-per-step file) first.
#   note TEXT...      print TEXT and append it to $summary
#   step NAME CMD...  run CMD, its output appended to $out/NAME.log; note its exit code, time and last
#                     lines; return its exit code (a step's failure never stops the script)
note() { echo "$*" | tee -a "$summary"; }
step() {
  local name=$1 t0=$SECONDS rc
  shift
  echo "\$ $*" >>"$out/$name.log"
  "$@" >>"$out/$name.log" 2>&1
  rc=$?
  note "$name: exit $rc in $((SECONDS - t0)) s: $*"
  tail -n 4 "$out/$name.log" | sed 's/^/    /' | tee -a "$summary"
  return $rc
}
