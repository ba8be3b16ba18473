# Sourced by scripts/setup and scripts/test: whether the lock applies to the venv's Python.
# constraints.txt is made for one CPython (its header says which); another Python installs
# from pyproject.toml's ranges, as QKV_LOCK=latest does.
lock_applies() {  # lock_applies VENV -> exit status 0 when the lock is used
  [ "${QKV_LOCK:-}" != latest ] || return 1
  local want have
  want="$(sed -n 's/^# CPython \([0-9.]*\) on.*/\1/p' constraints.txt)"
  have="$("$1/bin/python" -c 'import sys; print(*sys.version_info[:2], sep=".")')"
  [ "$want" = "$have" ] && return 0
  echo "setup: the lock is made for CPython $want, this is $have: installing from pyproject.toml's ranges" >&2
  return 1
}
