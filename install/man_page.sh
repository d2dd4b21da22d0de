#!/bin/sh
# One man page from a command's own --help (install/meson.build):
#   man_page.sh HELP2MAN AGENTVM VERSION PAGE SUBCOMMAND DESCRIPTION OUTPUT
# SUBCOMMAND empty: agentvm's own page. help2man names a page after the program it runs, so a
# subcommand's page (agentvm-run) gets its own name in the title and NAME section here.
set -eu
help2man=$1 agentvm=$2 version=$3 page=$4 subcommand=$5 description=$6 output=$7
# help2man writes a page even when --help fails; the page must not be that failure.
"$agentvm" $subcommand --help >/dev/null
"$help2man" --no-info --no-discard-stderr --version-string="$version" --name="$description" \
  --help-option="${subcommand:+$subcommand }--help" "$agentvm" |
  sed -e "s/^\.TH AGENTVM /.TH $(echo "$page" | tr a-z A-Z) /" -e "s/^agentvm \\\\- /$page \\\\- /" >"$output"
