#!/usr/bin/env bash
# Check commit subjects against CONTRIBUTING's rule: at most 72 characters, not empty.
#   scripts/check_commits.sh         the commits not yet on the upstream branch; without one,
#                                    the last commit
#   scripts/check_commits.sh BASE    the commits after BASE (a commit, branch or tag): BASE..HEAD
# Lists each subject that breaks the rule and exits 1; exit 2 for a BASE git does not know.
set -euo pipefail
export LC_ALL=C.UTF-8  # count characters, not bytes
limit=72
case $# in
    0)
        if base=$(git rev-parse -q --verify '@{upstream}' 2>/dev/null); then
            :
        elif git rev-parse -q --verify HEAD~1 >/dev/null; then
            base=HEAD~1
        else
            base=""  # a first commit: check it alone
        fi
        ;;
    1)
        base=$(git rev-parse -q --verify "$1^{commit}") || {
            echo "check_commits.sh: '$1' is not a commit here; name a commit, branch or tag" >&2
            exit 2
        }
        ;;
    *)
        echo "check_commits.sh: one argument at most, the base commit" >&2
        exit 2
        ;;
esac
range=HEAD
[[ -n $base ]] && range="$base..HEAD"
bad=0
count=0
while IFS=$'\t' read -r hash subject; do
    count=$((count + 1))
    if [[ -z $subject ]]; then
        echo "$hash: empty subject"
        bad=$((bad + 1))
    elif ((${#subject} > limit)); then
        echo "$hash: ${#subject} characters (at most $limit): $subject"
        bad=$((bad + 1))
    fi
done < <(git log --no-merges --format='%h%x09%s' "$range")
if ((bad)); then
    echo "check_commits.sh: $bad of $count commit subjects break the rule; reword them (git rebase -i)" >&2
    exit 1
fi
echo "check_commits.sh: commits checked: $count; every subject at most $limit characters"
