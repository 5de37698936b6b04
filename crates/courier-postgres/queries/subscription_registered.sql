-- Whether subscription $1 exists with every pattern of $2 already: then a
-- registration changes nothing and takes no lock. Touches: reads
-- subscriptions, subscription_topics.
SELECT EXISTS (SELECT 1 FROM {schema}.subscriptions s WHERE s.name = $1)
   AND NOT EXISTS (
     SELECT 1 FROM unnest($2::text[]) AS p (pattern)
     WHERE NOT EXISTS (SELECT 1 FROM {schema}.subscription_topics t
                       WHERE t.subscription = $1 AND t.pattern = p.pattern))
