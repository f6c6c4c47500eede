#!/usr/bin/env bash
# Install this Quantdeck bundle for the current user (run it from the unpacked tarball):
#
#   ./quantdeck/install.sh              # the bundle into ~/.local/opt/quantdeck, the command
#                                       # ~/.local/bin/quantdeck, the desktop entry and icons
#   ./quantdeck/install.sh --uninstall  # all of that removed again
#
# PREFIX (default ~/.local) moves opt/ and bin/. Only what a Quantdeck bundle made is replaced
# or removed: another program's ~/.local/bin/quantdeck or a folder without the bundle's marker
# is refused. The bundle serves through an engine, a Python with vLLM: `quantdeck engines add
# PATH` (or `quantdeck engines` to see the ones found).
set -euo pipefail
src=$(cd "$(dirname "$0")" && pwd)
prefix=${PREFIX:-$HOME/.local}
dest="$prefix/opt/quantdeck"
link="$prefix/bin/quantdeck"
marker=.quantdeck-bundle

ours_link() {  # the command link points into a Quantdeck bundle
  [ -L "$link" ] && [ -f "$(dirname "$(readlink -f "$link")")/$marker" ]
}
refuse() { echo "install.sh: $*" >&2; exit 2; }

if [ "${1:-}" = "--uninstall" ]; then
  if [ -x "$dest/quantdeck" ] && [ -f "$dest/$marker" ]; then
    "$dest/quantdeck" desktop-uninstall || true
  fi
  if [ -e "$link" ] || [ -L "$link" ]; then
    ours_link || refuse "$link is not a link to a Quantdeck bundle; left as it is"
    rm -f "$link"
  fi
  if [ -e "$dest" ]; then
    [ -f "$dest/$marker" ] || refuse "$dest holds no Quantdeck bundle; left as it is"
    rm -rf "$dest"
  fi
  echo "install.sh: Quantdeck removed"
  exit 0
fi
[ $# -eq 0 ] || refuse "unknown argument '$1' (--uninstall, or none)"
[ -f "$src/$marker" ] && [ -x "$src/quantdeck" ] || refuse "$src is not an unpacked Quantdeck bundle"
[ ! -e "$dest" ] || [ -f "$dest/$marker" ] || refuse "$dest exists and holds no Quantdeck bundle"
if [ -e "$link" ] || [ -L "$link" ]; then
  ours_link || refuse "$link exists and is not a Quantdeck bundle's link"
fi
mkdir -p "$prefix/opt" "$prefix/bin"
if [ "$src" != "$dest" ]; then
  # copied beside the old one, then renamed into place: an interrupted copy leaves the old one
  tmp=$(mktemp -d "$prefix/opt/.quantdeck.XXXXXX")
  cp -a "$src/." "$tmp/"
  if [ -e "$dest" ]; then
    mv "$dest" "$tmp.old"
  fi
  mv "$tmp" "$dest"
  rm -rf "$tmp.old"
fi
ln -sfn "$dest/quantdeck" "$link.tmp.$$"
mv -T "$link.tmp.$$" "$link"
"$dest/quantdeck" desktop-install
echo "install.sh: $("$dest/quantdeck" --version) in $dest; the command: $link"
case ":$PATH:" in
  *":$prefix/bin:"*) ;;
  *) echo "install.sh: $prefix/bin is not on PATH; add it to run 'quantdeck' by name" ;;
esac
