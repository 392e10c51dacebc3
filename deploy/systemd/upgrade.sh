#!/bin/sh
# Replaces the running corelane-echo instance with the other one, dropping no connection: the
# new instance takes over through /run/corelane-echo.upgrade and the old one drains and ends.
set -eu
if systemctl is-active --quiet corelane-echo@a; then
    old=a new=b
else
    old=b new=a
fi
systemctl start "corelane-echo@$new"
echo "corelane-echo@$new serves; corelane-echo@$old drains and ends by itself"
