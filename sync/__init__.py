"""What both sync backends share: the codecs and their error feedback, tensor payloads, the outer step."""
