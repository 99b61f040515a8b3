#!/bin/sh
# Download a build output (engine/, tokenizer/, model_repository/) from S3-compatible storage and refuse it
# unless every file matches the checksum file at the prefix (sha256sum format) and no file is left unlisted.
# Env: S3_BUCKET, S3_PREFIX, S3_ENDPOINT (optional), DEST_DIR, CHECKSUM_FILE (default SHA256SUMS).
# Exit 0: verified. 3: no checksum file. 4: checksum mismatch. 5: unlisted files. Other: settings or download error.
set -eu

: "${S3_BUCKET:?S3_BUCKET is not set (engine.s3.bucket)}"
: "${DEST_DIR:?DEST_DIR is not set}"
CHECKSUM_FILE="${CHECKSUM_FILE:-SHA256SUMS}"
PREFIX="${S3_PREFIX:-}"
PREFIX="${PREFIX#/}"
SRC="s3://${S3_BUCKET}/${PREFIX}"

echo "fetch-engine: ${SRC} -> ${DEST_DIR}"
mkdir -p "${DEST_DIR}"
if [ -n "${S3_ENDPOINT:-}" ]; then
  aws --endpoint-url "${S3_ENDPOINT}" s3 sync --only-show-errors --no-progress "${SRC}" "${DEST_DIR}"
else
  aws s3 sync --only-show-errors --no-progress "${SRC}" "${DEST_DIR}"
fi

cd "${DEST_DIR}"
if [ ! -f "${CHECKSUM_FILE}" ]; then
  echo "fetch-engine: ${SRC} has no ${CHECKSUM_FILE}: refusing an engine that cannot be verified" >&2
  echo "fetch-engine: write it with: (cd BUILD_OUTPUT && find . -type f ! -name ${CHECKSUM_FILE} | sort | xargs sha256sum > ${CHECKSUM_FILE})" >&2
  exit 3
fi
if ! sha256sum -c --strict --quiet "${CHECKSUM_FILE}"; then
  echo "fetch-engine: checksum mismatch in ${SRC} (lines above): corrupt or partial upload; not starting" >&2
  exit 4
fi
# Every downloaded file must be covered: an engine file nobody checksummed is as bad as a wrong one.
listed="$(mktemp)"
present="$(mktemp)"
sed -e 's/^[0-9a-fA-F]* [ *]//' -e 's|^\./||' "${CHECKSUM_FILE}" | sort > "${listed}"
find . -type f ! -name "${CHECKSUM_FILE}" | sed 's|^\./||' | sort > "${present}"
unlisted="$(comm -13 "${listed}" "${present}")"
rm -f "${listed}" "${present}"
if [ -n "${unlisted}" ]; then
  echo "fetch-engine: files not in ${CHECKSUM_FILE}: ${unlisted}" >&2
  exit 5
fi
echo "fetch-engine: $(wc -l < "${CHECKSUM_FILE}" | tr -d ' ') files verified"
