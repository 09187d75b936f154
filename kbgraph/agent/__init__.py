"""What agents call: the tools, their catalogue and request/response shapes, the search modes and
``link_suggest``'s text evidence."""
