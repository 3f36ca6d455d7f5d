#!/usr/bin/env bash
# Checks that the reasons written in the repository stay self-contained:
#
# 1. no comment or document cites a source that is not in the repository: sections of an
#    external specification (`spec §3.5`, `spec 3.12`, `spec section 6`), house-style rules
#    (`STYLE rule 9`, `STYLE 5.4`, `STYLE.md`), `DESIGN.md`, `test-infra.md`, or the numbered
#    issues of a tracker (`issue 17`). State the rule where it is used, or link to its section
#    of docs/design.md;
# 2. every `docs/design.md#anchor` named in src/, crates/ and tests/ (and every
#    `design.md#anchor` link in docs/) exists: anchors are the explicit `<a id="…"></a>` lines
#    of docs/design.md.
#
# Dated reports (docs/benchmarks.md, docs/history*) are left as they were written.
# Usage: scripts/check-reasons.sh   (from anywhere; exit 1 and one line per finding on failure)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
self=scripts/check-reasons.sh
design=docs/design.md

dirs=()
for d in src crates tests docs deploy charts; do
  [[ -d $d ]] && dirs+=("$d")
done

# Citations of documents and trackers outside the repository.
pattern='spec §|spec [0-9]|spec sections? [0-9]|STYLE rule|STYLE [0-9]|STYLE\.md|DESIGN\.md|test-infra\.md|/work/shared|[Ii]ssues? [0-9]'

fail=0
bad_anchor=0
skip() {
  case $1 in
  "$self" | docs/benchmarks.md | docs/history* | docs/*/history* | */target/*) return 0 ;;
  esac
  return 1
}

while IFS= read -r hit; do
  file=${hit%%:*}
  skip "$file" && continue
  rest=${hit#*:}
  echo "$file:${rest%%:*}: cites a source outside the repository; state the rule or link to $design#<anchor>: ${rest#*:}" >&2
  fail=1
done < <(grep -rHnIE --exclude-dir=target --exclude-dir=.git "$pattern" "${dirs[@]}" || true)

# Anchors of docs/design.md, exactly as written in its `<a id="…"></a>` lines.
if [[ ! -f $design ]]; then
  echo "$design: missing" >&2
  exit 1
fi
mapfile -t anchors < <(grep -oE '<a id="[^"]+"></a>' "$design" | sed -E 's/<a id="([^"]+)"><\/a>/\1/')
dupes=$(printf '%s\n' "${anchors[@]}" | sort | uniq -d)
if [[ -n $dupes ]]; then
  echo "$design: anchors defined twice: $dupes" >&2
  fail=1
fi
known() {
  local a
  for a in "${anchors[@]}"; do
    [[ $a == "$1" ]] && return 0
  done
  return 1
}

check_links() { # $1 = regex of the link's path part; the rest = paths to search
  local re=$1
  shift
  while IFS= read -r hit; do
    file=${hit%%:*}
    skip "$file" && continue
    rest=${hit#*:}
    line=${rest%%:*}
    anchor=${rest#*:}
    anchor=${anchor#*#}
    if ! known "$anchor"; then
      echo "$file:$line: $design has no anchor \"$anchor\"" >&2
      fail=1
      bad_anchor=1
    fi
  done < <(grep -rHnoIE --exclude-dir=target --exclude-dir=.git "$re#[A-Za-z0-9_-]+" "$@" || true)
}

code_dirs=()
for d in src crates tests; do
  [[ -d $d ]] && code_dirs+=("$d")
done
check_links 'docs/design\.md' "${code_dirs[@]}"
# Markdown links between the documents, `(design.md#anchor)`, and within docs/design.md, `(#anchor)`.
check_links '\(design\.md' docs
check_links '\]\(' "$design"

if ((bad_anchor)); then
  echo "anchors of $design: ${anchors[*]}" >&2
fi
if ((fail)); then
  echo "check-reasons: FAILED" >&2
  exit 1
fi
echo "check-reasons: ok (${#anchors[@]} anchors in $design)"
