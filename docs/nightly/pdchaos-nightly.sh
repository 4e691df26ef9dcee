#!/bin/sh
# The nightly run of one deployment (README, "Run it every night"): its suite, the night's report (pushed to the
# Pushgateway, labelled with the deployment), then the trend over every night so far.
# The unit's result is the suite's exit code (0 passed, 1 a check failed, 3 stopped, 4 cleanup unverified, 5
# unreachable). Set by pdchaos-nightly.service (or /etc/pdchaos/nightly.env): SUITE, DEPLOYMENT_FILE, LABEL, JOURNALS,
# PUSHGATEWAY.
set -u
NIGHT=$(date -u +%F)
pdchaos suite "$SUITE" -c "$DEPLOYMENT_FILE" --label "$LABEL" --journal "$JOURNALS/$LABEL-$NIGHT.json" --junit "$JOURNALS/$LABEL-$NIGHT.xml" --html "$JOURNALS/$LABEL-$NIGHT.html"
rc=$?
pdchaos report "$JOURNALS"/*-"$NIGHT".json --junit "$JOURNALS/fleet-$NIGHT.xml" --html "$JOURNALS/fleet-$NIGHT.html" --push "$PUSHGATEWAY"
pdchaos report --trend "$JOURNALS" --html "$JOURNALS/trend.html"
exit "$rc"
