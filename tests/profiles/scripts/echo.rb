# Echo profile (ruby): streams "echo: " and the message, reports a session id, prints the reply.
require "json"
message = ENV.fetch("AGENT_MESSAGE")
previous = ENV.fetch("AGENT_SESSION_ID", "")
$stdout.sync = true
puts "AGENT_PARTIAL:" + JSON.generate("echo: ")
puts "AGENT_PARTIAL:" + JSON.generate(message)
puts "AGENT_SESSION:" + (previous.empty? ? "rb-1" : previous + "+")
puts "echo: " + message
