#!/bin/sh
# PySpark 4 needs Java 17 or newer; say so plainly instead of failing deep in py4j.
if [ -n "$JAVA_HOME" ] && [ -x "$JAVA_HOME/bin/java" ]; then
    java="$JAVA_HOME/bin/java"
elif command -v java >/dev/null 2>&1; then
    java=java
else
    echo "error: Java not found. beam_ext runs on PySpark 4, which needs Java 17+." >&2
    echo "       Install it (Debian: apt-get install openjdk-17-jre-headless) or set JAVA_HOME." >&2
    exit 1
fi
version=$("$java" -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -n 1)
if [ -z "$version" ] || [ "$version" -lt 17 ]; then
    echo "error: $java is Java '${version:-unknown}'; PySpark 4 needs Java 17 or newer." >&2
    exit 1
fi
