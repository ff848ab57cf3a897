#!/usr/bin/env bash
# Installs the pinned llmwiki-serve used by the knowledge-source tests into its own virtualenv in
# the cache outside the work tree. A re-run with the same version does nothing; a version bump
# installs beside the old one. Prints the virtualenv's path.
set -euo pipefail

VERSION="0.2.17"
DIR="${XWORKMATE_LLMWIKI_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/xworkmate-bridge/llmwiki-$VERSION}"
PYTHON="${PYTHON:-python3}"
WANT="llmwiki-serve==$VERSION"

if [ -f "$DIR/.installed" ] && [ "$(cat "$DIR/.installed")" = "$WANT" ] && [ -x "$DIR/bin/llmwiki-serve" ]; then
  echo "$DIR"
  exit 0
fi
rm -rf "$DIR"
mkdir -p "$(dirname "$DIR")"
echo "installing $WANT into $DIR" >&2
"$PYTHON" -m venv "$DIR"
"$DIR/bin/pip" install --quiet --disable-pip-version-check "$WANT" >&2
"$DIR/bin/llmwiki-serve" --version >&2
echo "$WANT" > "$DIR/.installed"
echo "$DIR"
