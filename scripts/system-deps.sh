#!/usr/bin/env bash
# Install the Debian packages named in system-packages.txt that are missing; nothing when all are
# there. As root: `apt-get update` once, then `apt-get install` of just the missing ones. As any
# other user with something missing: one line naming the command to run, exit 2.
set -euo pipefail
cd "$(dirname "$0")/.."
list=system-packages.txt
missing=()
while read -r pkg _; do
  case "$pkg" in ''|'#'*) continue ;; esac
  status=$(dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null || true)
  [ "$status" = "install ok installed" ] || missing+=("$pkg")
done < "$list"
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" != 0 ]; then
  echo "$list: missing Debian packages ${missing[*]}; run: sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 2
fi
echo "installing Debian packages: ${missing[*]}"
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"
