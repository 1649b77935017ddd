#!/usr/bin/env bash
# adoptcheck.sh — take pkg/outbox and pkg/inbox as an adopter does, outside this workspace.
#
# Pass 1, each library alone: copy the folder to a temporary directory, rename its module to
# example.com/acme/<name> (go.mod and every import in its .go files), then `go mod tidy -diff`
# must print nothing, `go vet ./...` must pass, every test must compile, and the tests that
# depend on where the code lives must pass: the examples, the import rules, the README
# snippets, the migrations (embedded files and the other tools' copies), and the core tests
# of Add, the relay, the publisher, the consumer and Process. The whole suite runs once, in
# the workspace (`make test`): the copies hold the same code under another module path, and a
# third run of every test would add minutes of CI and nothing a rename can break.
#
# Pass 2, both folded into one module: example.com/acme/shop with outbox/ and inbox/ beside
# each other, one go.mod holding the requirements of both libraries' go.mod files, tidied with
# `go mod tidy`; then `go vet ./...` and the examples and core tests of both.
#
# GOWORK=off, and GOFLAGS=-mod=readonly, so a missing go.sum line or an untidy go.mod fails
# instead of being repaired on the fly. Tests need PostgreSQL and RabbitMQ like `make test`
# (OUTBOXSHOP_TEST_POSTGRES_URL and OUTBOXSHOP_TEST_AMQP_URL, or a Docker engine), and the
# module proxy for modules not yet in the module cache.
#
# Usage: tools/adoptcheck.sh   (run by `make test`; ADOPTCHECK_KEEP=1 keeps the copies)
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
prefix=github.com/outboxshop/outboxshop/pkg
libs=(outbox inbox)

export GOWORK=off GOFLAGS=-mod=readonly

tmp=$(mktemp -d "${TMPDIR:-/tmp}/adoptcheck.XXXXXX")
if [[ -n "${ADOPTCHECK_KEEP:-}" ]]; then
	echo "adoptcheck: copies kept in $tmp"
else
	trap 'rm -rf "$tmp"' EXIT
fi

# rename DIR OLD NEW: rewrite the module path OLD to NEW in every .go file and go.mod under DIR,
# and fail if OLD is still named anywhere in them.
rename() {
	local dir=$1 old=$2 new=$3
	find "$dir" -type f \( -name '*.go' -o -name go.mod \) -print0 |
		xargs -0 sed -i "s#\"$old\([/\"]\)#\"$new\1#g; s#^module $old\$#module $new#"
	if grep -rn --include='*.go' --include=go.mod -e "$old" "$dir"; then
		echo "adoptcheck: $old is still named in $dir after the rename" >&2
		return 1
	fi
}

# tidy_clean DIR: `go mod tidy -diff` prints no diff and exits 0. Its diff is on stdout; its
# stderr is kept apart, since on a machine with a cold module cache it reports every module it
# downloads there ("go: downloading ..."), which is no diff.
tidy_clean() {
	local out errf rc=0
	errf=$(mktemp)
	out=$(cd "$1" && go mod tidy -diff 2>"$errf") || rc=$?
	if [[ $rc -ne 0 || -n "$out" ]]; then
		echo "adoptcheck: go.mod/go.sum in $1 are not tidy (go mod tidy -diff exited $rc):" >&2
		echo "$out" >&2
		grep -v '^go: downloading ' "$errf" >&2 || true
		rm -f "$errf"
		return 1
	fi
	rm -f "$errf"
}

# The tests a copy runs (pass 1): what a module path, a folder or an embedded file can break.
wiring='Example|^TestImports|^TestDocSnippets|^TestMigrat|^TestToolMigrations|^TestGooseStatements|^TestCopies|^TestStatementsNameTheirTables|^TestAdd$|^TestRelay$|^TestPublisher$|^TestConsumer$|^TestProcess$'

# Pass 1: each library alone.
for lib in "${libs[@]}"; do
	dir=$tmp/$lib
	echo "==> adoptcheck: $lib alone as example.com/acme/$lib"
	cp -R "$root/pkg/$lib" "$dir"
	rename "$dir" "$prefix/$lib" "example.com/acme/$lib"
	tidy_clean "$dir"
	(cd "$dir" && go vet ./... && go test -count=1 -run "$wiring" ./...)
done

# Pass 2: both folded into one module, as pkg/outbox/README.md and pkg/inbox/README.md describe.
shop=$tmp/shop
echo "==> adoptcheck: outbox and inbox folded into example.com/acme/shop"
mkdir "$shop"
for lib in "${libs[@]}"; do
	cp -R "$root/pkg/$lib" "$shop/$lib"
	rm "$shop/$lib/go.mod" "$shop/$lib/go.sum"
	rename "$shop/$lib" "$prefix/$lib" "example.com/acme/shop/$lib"
done
goline=$(cd "$root/pkg/outbox" && go mod edit -json | sed -n 's/^\t"Go": "\(.*\)",$/\1/p')
(
	cd "$shop"
	go mod init example.com/acme/shop >/dev/null 2>&1
	go mod edit -go="$goline"
	# The adopter merges both require blocks; tidy then keeps the higher of two versions.
	for lib in "${libs[@]}"; do
		awk '/^require \(/ { r = 1; next } r && /^\)/ { r = 0 }
			r { print "-require=" $1 "@" $2 } /^require [^(]/ { print "-require=" $2 "@" $3 }' \
			"$root/pkg/$lib/go.mod" | xargs go mod edit
	done
	cat "$root/pkg/outbox/go.sum" "$root/pkg/inbox/go.sum" | sort -u >go.sum
	go mod tidy
)
tidy_clean "$shop"
(cd "$shop" && go vet ./... && go test -count=1 -run 'Example|TestAdd|TestProcess' ./...)
echo "==> adoptcheck: ok"
