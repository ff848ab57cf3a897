# Echo profile (bash): streams "echo: " and the message (plain ASCII in the tests), reports a
# session id, prints the reply.
json() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$s"; }
echo "AGENT_PARTIAL:$(json 'echo: ')"
echo "AGENT_PARTIAL:$(json "$AGENT_MESSAGE")"
if [ -n "$AGENT_SESSION_ID" ]; then echo "AGENT_SESSION:$AGENT_SESSION_ID+"; else echo "AGENT_SESSION:sh-1"; fi
echo "echo: $AGENT_MESSAGE"
