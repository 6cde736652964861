#!/usr/bin/env bash
# Remove the POSIX shared-memory files of UCX (/dev/shm/ucx_shm_posix_*) that no process
# has open or mapped any more. UCX 1.13 creates such a file for a worker's FIFO or an
# allocation, fills it, maps it and unlinks it; a process killed in between (the tests
# SIGKILL servers and clients on purpose) leaves the file behind, and /dev/shm memory is
# not given back until the file goes. A file some live process still holds is left alone.
set -euo pipefail

shopt -s nullglob
files=(/dev/shm/ucx_shm_posix_*)
[ ${#files[@]} -eq 0 ] && exit 0

# Every file any process holds: its open descriptors and its mappings.
held=$( { find /proc/[0-9]*/fd -type l -printf '%l\n' 2>/dev/null || true
          cat /proc/[0-9]*/maps 2>/dev/null | awk '{print $6}' || true; } | sort -u)

removed=0 bytes=0
for f in "${files[@]}"; do
  if ! grep -qxF -e "$f" -e "$f (deleted)" <<<"$held"; then
    size=$(stat -c %s "$f" 2>/dev/null || echo 0)
    if rm -f -- "$f"; then
      removed=$((removed + 1)) bytes=$((bytes + size))
    fi
  fi
done
echo "removed $removed orphaned UCX shared-memory file(s) of /dev/shm ($((bytes / 1048576)) MiB)"
