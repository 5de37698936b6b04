-- Adds topic patterns to a subscription; existing patterns are kept as they are.
-- $2 patterns, $3 prefixes (NULL for an exact topic, '' for `*`).
INSERT INTO {schema}.subscription_topics (subscription, pattern, prefix)
SELECT $1, p.pattern, p.prefix FROM unnest($2::text[], $3::text[]) AS p (pattern, prefix)
ON CONFLICT (subscription, pattern) DO NOTHING
