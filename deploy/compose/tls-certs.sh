#!/bin/sh
# The compose stack's TLS certificates (docker-compose.yml, service tls-certs): a private CA,
# one server certificate for the three RabbitMQ nodes and one for PostgreSQL, each naming the
# hosts the shop dials (the compose service names), written into the volumes mounted under
# DIR:
#
#   DIR/ca/ca.crt                          the CA alone: what the shop processes mount
#   DIR/rabbitmq/{ca,server}.crt, server.key   the nodes', the key owned by rabbitmq (100:101)
#   DIR/postgres/server.crt, server.key        the server's, the key owned by postgres (70:70)
#
# It runs in the rabbitmq image (openssl is in it: the image checks `openssl version` when it
# is built), as root, on every `docker compose up`: while every file is there and no
# certificate expires within 30 days it changes nothing. Otherwise it issues everything anew,
# from a new CA whose key lives in a temporary folder and is deleted on exit: nothing can sign
# with it afterwards, and no key is ever in the repository.
#
# The owners are the uids of the images' users: rabbitmq is 100:101 in the alpine variant of
# the rabbitmq image, postgres 70:70 in the alpine variant of the postgres image (both set in
# their Dockerfiles); PostgreSQL refuses a key that others than its owner can read.
#
#   sh tls-certs.sh DIR
set -eu

out=${1:?usage: tls-certs.sh DIR}
ca=$out/ca mq=$out/rabbitmq pg=$out/postgres
days=825

fresh() {
	for f in "$ca/ca.crt" "$mq/ca.crt" "$mq/server.crt" "$mq/server.key" "$pg/server.crt" "$pg/server.key"; do
		[ -s "$f" ] || return 1
	done
	for c in "$ca/ca.crt" "$mq/server.crt" "$pg/server.crt"; do
		openssl x509 -checkend 2592000 -noout -in "$c" >/dev/null || return 1
	done
}

if fresh; then
	echo "tls-certs: the certificates in $out are in place"
	exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# A configuration of its own, so that nothing depends on the image's openssl.cnf.
cat >"$work/req.cnf" <<'EOF'
[req]
distinguished_name = dn
prompt = no
x509_extensions = ca_ext
[dn]
CN = outboxshop compose CA
[ca_ext]
basicConstraints = critical,CA:TRUE,pathlen:0
keyUsage = critical,keyCertSign,cRLSign
subjectKeyIdentifier = hash
EOF
openssl req -x509 -config "$work/req.cnf" -newkey rsa:2048 -nodes -sha256 -days 3650 \
	-keyout "$work/ca.key" -out "$work/ca.crt" 2>/dev/null

# issue NAME HOST…: a server certificate for the hosts, signed by the CA.
issue() {
	name=$1
	shift
	san=$(printf 'DNS:%s,' "$@")
	cat >"$work/$name.ext" <<EOF
basicConstraints = critical,CA:FALSE
keyUsage = critical,digitalSignature,keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = ${san%,}
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid
EOF
	openssl req -new -config "$work/req.cnf" -subj "/CN=$1" -newkey rsa:2048 -nodes \
		-keyout "$work/$name.key" -out "$work/$name.csr" 2>/dev/null
	openssl x509 -req -in "$work/$name.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" \
		-CAcreateserial -CAserial "$work/ca.srl" -sha256 -days "$days" \
		-extfile "$work/$name.ext" -out "$work/$name.crt" 2>/dev/null
}

issue rabbitmq rabbitmq rabbitmq-2 rabbitmq-3
issue postgres postgres

# put SRC DEST OWNER MODE
put() {
	cp "$1" "$2"
	chmod "$4" "$2"
	if [ "$(id -u)" = 0 ]; then
		chown "$3" "$2"
	fi
}

mkdir -p "$ca" "$mq" "$pg"
put "$work/ca.crt" "$ca/ca.crt" 0:0 0644
put "$work/ca.crt" "$mq/ca.crt" 100:101 0644
put "$work/rabbitmq.crt" "$mq/server.crt" 100:101 0644
put "$work/rabbitmq.key" "$mq/server.key" 100:101 0600
put "$work/postgres.crt" "$pg/server.crt" 70:70 0644
put "$work/postgres.key" "$pg/server.key" 70:70 0600
echo "tls-certs: issued a new CA and the certificates of rabbitmq, rabbitmq-2, rabbitmq-3 and postgres in $out"
