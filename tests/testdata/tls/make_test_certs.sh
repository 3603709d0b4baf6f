#!/usr/bin/env bash
# Regenerates the TEST-ONLY TLS certificates of this folder (checked in, valid for
# 100 years, private keys public: never use them outside tests):
#   ca.pem                   the test CA ("ringattn test CA"; its key is thrown away)
#   node.pem / node.key      coordinator and workers: serverAuth + clientAuth, for
#                            127.0.0.1 and localhost, signed by the CA
#   client.pem / client.key  a client of the public API: clientAuth, signed by the CA
#   tokens.txt               bearer tokens for the coordinator's --auth_token_file
# Usage: tests/testdata/tls/make_test_certs.sh (needs the openssl CLI).
set -euo pipefail
cd "$(dirname "$0")"
DAYS=36500
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

openssl req -x509 -newkey rsa:2048 -nodes -days "$DAYS" -keyout "$tmp/ca.key" -out ca.pem \
  -subj "/CN=ringattn test CA" \
  -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" \
  2>/dev/null

# sign NAME SUBJECT EXTENSIONS: NAME.key and NAME.pem signed by the CA.
sign() {
  openssl req -newkey rsa:2048 -nodes -keyout "$1.key" -out "$tmp/$1.csr" -subj "$2" 2>/dev/null
  printf '%s\n' "$3" >"$tmp/$1.ext"
  openssl x509 -req -in "$tmp/$1.csr" -CA ca.pem -CAkey "$tmp/ca.key" -CAcreateserial \
    -CAserial "$tmp/ca.srl" -days "$DAYS" -extfile "$tmp/$1.ext" -out "$1.pem" 2>/dev/null
}
sign node "/CN=ringattn test node" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth,clientAuth
subjectAltName=IP:127.0.0.1,DNS:localhost"
sign client "/CN=ringattn test client" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"

cat >tokens.txt <<'TOKENS'
# Test-only bearer tokens, one per line (blank lines and lines starting with # are skipped).
test-token-alpha-6a3f9c
test-token-beta-0d71e2
TOKENS
echo "regenerated $(pwd)"
