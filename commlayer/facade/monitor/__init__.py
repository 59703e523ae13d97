"""What the facade knows about its peers while ops run: the peer monitor and its thread, the
progress the ranks compare after a timeout, and the flight-recorder dumps."""
